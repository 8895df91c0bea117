"""HTTP/1.1 without I/O, the server side, on h11: requests in (whole, with their bodies capped),
responses out (``HttpServerConnection``), and the parsing of request targets (``Target``).

Used by the broker's HTTP front (``kafkaesque.broker.http``); it knows nothing of it.
"""

from ._server import (
    NEED_DATA,
    BadRequest,
    Closed,
    HttpLimits,
    HttpServerConnection,
    NeedData,
    Request,
    Response,
    ServerEvent,
)
from ._target import BadTarget, Target, parse_target

__all__ = [
    "NEED_DATA",
    "BadRequest",
    "BadTarget",
    "Closed",
    "HttpLimits",
    "HttpServerConnection",
    "NeedData",
    "Request",
    "Response",
    "ServerEvent",
    "Target",
    "parse_target",
]
