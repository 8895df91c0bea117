"""The REST API's error answers (docs/http.md "Errors"), shared by its routes: ``RestError``
(a status and the JSON body ``{error_code, code, message, retriable, maybe_applied}``), the
status of each of our error codes, and the small checks every route uses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from kafkaesque.protocol import ErrorCode, ErrorReply
from kafkaesque.protocol.http import Response

# Our codes' HTTP statuses; a code not named here is 503 when retriable, else 500.
_STATUS: Final = {
    ErrorCode.UNKNOWN_TOPIC: 404,
    ErrorCode.UNKNOWN_PARTITION: 404,
    ErrorCode.UNKNOWN_SUBSCRIPTION: 404,
    ErrorCode.UNKNOWN_GROUP: 404,
    ErrorCode.BAD_ARGS: 422,
    ErrorCode.INVALID_TOPIC: 422,
    ErrorCode.INVALID_CONFIG: 422,
    ErrorCode.INVALID_BATCH: 422,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.AUTH_FAILED: 401,
    ErrorCode.NOT_AUTHORIZED: 403,
    ErrorCode.TOPIC_EXISTS: 409,
    ErrorCode.GROUP_NOT_EMPTY: 409,
    ErrorCode.NOT_COMPACTED: 409,
    ErrorCode.FENCED: 409,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: 409,
    ErrorCode.OFFSET_OUT_OF_RANGE: 416,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.UNKNOWN_COMMAND: 500,
    ErrorCode.INTERNAL: 500,
}
ORDINAL: Final = {code: i for i, code in enumerate(ErrorCode, start=1)}


def status_of(code: ErrorCode) -> int:
    """The HTTP status that answers a request refused with ``code``."""
    status = _STATUS.get(code)
    if status is None:
        return 503 if code.retriable else 500
    return status


def error_body(
    error_code: int, code: str, message: str, retriable: bool, maybe_applied: bool
) -> bytes:
    """The JSON body of an error answer."""
    return to_json(
        {
            "error_code": error_code,
            "code": code,
            "message": message,
            "retriable": retriable,
            "maybe_applied": maybe_applied,
        }
    )


class RestError(Exception):
    """A request answered with an error: ``status`` and the JSON body of ``error_body``.

    ``error_code`` is ``status * 100`` plus our code's number (its place in ``ErrorCode``, from
    1), as Confluent's are the status and a detail; ``code`` names it."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retriable: bool = False,
        maybe_applied: bool = False,
        detail: int = 0,
        headers: Sequence[tuple[str, str]] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retriable = retriable
        self.maybe_applied = maybe_applied
        self.error_code = status * 100 + detail
        self.headers = tuple(headers)
        self.extra = extra or {}

    @classmethod
    def of(cls, reply: ErrorReply, extra: dict[str, Any] | None = None) -> RestError:
        """The answer to a command refused with ``reply``."""
        code = reply.code
        status = status_of(code)
        headers = [("Retry-After", "1")] if status == 503 else []
        return cls(
            status,
            code.name,
            reply.message,
            retriable=code.retriable,
            maybe_applied=code.outcome_unknown,
            detail=ORDINAL[code],
            headers=headers,
            extra=extra,
        )

    def response(self) -> Response:
        body = {
            "error_code": self.error_code,
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
            "maybe_applied": self.maybe_applied,
            **self.extra,
        }
        return Response(self.status, to_json(body), headers=self.headers)


def bad(message: str, status: int = 422) -> RestError:
    return RestError(status, "BAD_ARGS", message, detail=ORDINAL[ErrorCode.BAD_ARGS])


def to_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise RestError(
            405,
            "METHOD_NOT_ALLOWED",
            f"{method} is not served here: {', '.join(allowed)}",
            headers=[("Allow", ", ".join(allowed))],
        )
