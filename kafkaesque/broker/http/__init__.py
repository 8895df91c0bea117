"""The HTTP front of a broker: the REST API on its own listener (docs/http.md), and the admin
port's monitoring and web console (docs/console.md)."""

from ._console import ConsoleApi
from ._openapi import openapi_document
from ._service import HttpServer, HttpService, Streamed
from ._snapshot import ClusterSnapshots, Snapshot, SnapshotProbes
from ._timeline import Timeline, TimelineEvent
from ._wiring import HttpWiring

__all__ = [
    "ClusterSnapshots",
    "ConsoleApi",
    "HttpServer",
    "HttpService",
    "HttpWiring",
    "Snapshot",
    "SnapshotProbes",
    "Streamed",
    "Timeline",
    "TimelineEvent",
    "openapi_document",
]
