"""The HTTP front of a broker: the REST API on its own listener (docs/http.md)."""

from ._openapi import openapi_document
from ._service import HttpService
from ._wiring import HttpWiring

__all__ = ["HttpService", "HttpWiring", "openapi_document"]
