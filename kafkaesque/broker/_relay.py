"""Commands a client sent here that another broker answers: relayed there, the reply relayed back.

A consumer-group command goes to its group's coordinator (``GroupCoordinator.execute``), a
``LATEST`` to the leader of the key's partition (``CommandHandler.latest``). The broker that
answers encodes the client's reply once (``CommandReply``), and this broker hands those bytes to
the client as they are.
"""

from __future__ import annotations

import trio

from kafkaesque.protocol import (
    CommandReply,
    ErrorCode,
    GroupCommand,
    GroupCommandRequest,
    LatestRequest,
    Refused,
)

from ._errors import RequestError
from ._forwarding import Forwarder, ForwardError

_FORWARD_SLACK_S = 5.0


class CommandRelay:
    """Relays client commands to the broker that answers them, over ``forwarder``."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder

    async def forward_to(self, broker: int, command: GroupCommand, wait_s: float = 0.0) -> bytes:
        """Run a consumer-group command on ``broker`` (its coordinator); its encoded reply, to
        relay to the client as it is. ``RequestError`` if it does not answer within ``wait_s``
        and ``_FORWARD_SLACK_S``."""
        deadline = trio.current_time() + wait_s + _FORWARD_SLACK_S
        return await self._relayed(broker, GroupCommandRequest(command), deadline, "a command")

    async def forward_latest(self, broker: int, topic: str, partition: int, key: bytes) -> bytes:
        """``LATEST`` on ``broker``, the leader of the key's ``partition``; its encoded reply,
        to relay as it is. ``RequestError`` ``TIMEOUT`` (retriable: a read changes nothing) if it
        does not answer within ``_FORWARD_SLACK_S``."""
        deadline = trio.current_time() + _FORWARD_SLACK_S
        request = LatestRequest(topic, partition, key)
        return await self._relayed(broker, request, deadline, "LATEST")

    async def _relayed(
        self, broker: int, request: GroupCommandRequest | LatestRequest, deadline: float, what: str
    ) -> bytes:
        """``request`` answered by ``broker`` with a ``CommandReply``: its encoded client reply.
        ``RequestError``: ``TIMEOUT`` if no answer by ``deadline``, the refusal's own error for
        ``Refused`` (a broker that cannot read the request), ``INTERNAL`` for another."""
        try:
            answer = await self._forwarder.call(broker, request, deadline=deadline)
        except ForwardError as exc:
            raise RequestError(ErrorCode.TIMEOUT, f"forwarding to broker {broker}: {exc}") from exc
        if isinstance(answer, Refused):
            raise RequestError(answer.code, answer.message)
        if not isinstance(answer, CommandReply):
            raise RequestError(
                ErrorCode.INTERNAL, f"broker {broker} answered {what} with {answer!r:.200}"
            )
        return answer.data
