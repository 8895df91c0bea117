"""The HTTP front of a broker: the REST API on its own listener (docs/http.md)."""

from ._service import HttpService
from ._wiring import HttpWiring

__all__ = ["HttpService", "HttpWiring"]
