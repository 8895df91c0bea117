"""Requests between brokers, riding the Raft transport's connection to each peer.

A broker forwards what it cannot do itself: a write to the partition's leader, a read to a
broker that holds a replica, a command of the group-offsets partition to its leader. Items share
each peer's one TCP connection with Raft's messages (``PeerTransport``); their kinds start at 10
so the Raft driver's own kinds (0-2) stay apart:

* ``[APPEND, req, group, batch, count, acks]``: append this batch as the leader of ``group``;
* ``[COMMAND, req, command_bytes]``: run this line-protocol command (encoded with
  ``encode_command``) here and send back the encoded reply;
* ``[REPLY, req, payload]``: the answer to request ``req``;
* ``[LEADERS, {group: term}]``: every group the sender leads now (see ``LeaderTable``);
* ``[FIND_RESEND, req, group, client, packet, digest, seconds]``: as the leader of ``group``,
  look an MQTT QoS 1 resend up in its log (``WritePath.find_resend``);
* ``[SHARES, [[group, filter], ...]]``: the MQTT shared-subscription groups with members on the
  sender (see ``Egress``), on change and every second;
* ``[BOUNDS, req, [group, ...]]``: the log start and high watermark of each group the receiver
  leads (``[start, end]``, or None for a group it does not lead), for ``DESCRIBE``.

Outcomes are kept apart as the error taxonomy demands: ``PeerUnavailable`` means the request was
never sent (nothing happened there: retry freely); ``ForwardTimeout``, ``PeerLost`` and
``LeaderReplaced`` mean it may or may not have been carried out.

A request for one partition (``APPEND``, ``FIND_RESEND``) sent to its leader is not waited on
past that leader's replacement: a leader paused by SIGSTOP keeps its connection open and answers
nothing until it resumes (issue 23: writes waited out their whole deadline while a new leader
had long been elected). ``abandon_replaced``, run every few ticks, ends the calls whose broker is
silent (it stopped answering the Raft driver's pings) once another leader of their partition is
known. Only calls to a silent broker: a live old leader's own answer (done, or "not the leader,
retry") comes soon and is better news than "unknown".
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

log = logging.getLogger("kafkaesque.broker.forwarding")

APPEND = 10
COMMAND = 11
REPLY = 12
LEADERS = 13
FIND_RESEND = 14
SHARES = 15
BOUNDS = 16

BROKER_KINDS = frozenset({APPEND, COMMAND, REPLY, LEADERS, FIND_RESEND, SHARES, BOUNDS})


class ForwardError(Exception):
    """A forwarded request did not get an answer."""


class PeerUnavailable(ForwardError):
    """Not sent: no connection to that broker. Definitely not carried out."""


class ForwardTimeout(ForwardError):
    """Sent, but no answer in time: it may or may not have been carried out."""


class PeerLost(ForwardError):
    """Sent, then the connection closed before the answer: outcome unknown."""


class LeaderReplaced(ForwardError):
    """Sent to a partition's leader, which then went silent and was replaced: outcome unknown
    (it may have appended the batch, and replicated it, before it stopped)."""


# Kinds whose first argument is the partition's group, asked of its leader.
_LEADER_KINDS = frozenset({APPEND, FIND_RESEND})


@dataclass(eq=False)
class _Call:
    peer: int
    group: str | None = None  # the partition asked of its leader (``_LEADER_KINDS``)
    done: trio.Event = field(default_factory=trio.Event)
    payload: Any = None
    lost: bool = False
    replaced: bool = False


class Forwarder:
    """Outgoing calls and their answers. Use from the broker's trio thread only.

    ``send(peer, item) -> bool`` is the transport's (False: not connected, dropped).
    """

    def __init__(self, send: Callable[[int, Any], bool]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}

    def start(self, peer: int, kind: int, *args: Any) -> tuple[int, _Call]:
        """Send a request now (so requests to one peer keep their order); await ``finish``.

        Raises ``PeerUnavailable`` if it could not be sent.
        """
        req = next(self._ids)
        if not self._send(peer, [kind, req, *args]):
            raise PeerUnavailable(f"broker {peer} is not connected")
        group = args[0] if kind in _LEADER_KINDS and args and isinstance(args[0], str) else None
        call = _Call(peer, group)
        self._calls[req] = call
        return req, call

    async def finish(self, req: int, call: _Call, deadline: float) -> Any:
        """The answer's payload; ``ForwardTimeout``, ``PeerLost`` or ``LeaderReplaced`` when
        there is none."""
        try:
            with trio.move_on_at(deadline):
                await call.done.wait()
        finally:
            self._calls.pop(req, None)
        if call.lost:
            raise PeerLost(f"the connection to broker {call.peer} closed before it answered")
        if call.replaced:
            raise LeaderReplaced(
                f"broker {call.peer} went silent and {call.group} has a new leader; "
                "the outcome is unknown"
            )
        if not call.done.is_set():
            raise ForwardTimeout(f"broker {call.peer} did not answer in time")
        return call.payload

    async def call(self, peer: int, kind: int, *args: Any, deadline: float) -> Any:
        req, call = self.start(peer, kind, *args)
        return await self.finish(req, call, deadline)

    def answered(self, req: int, payload: Any) -> None:
        """A ``REPLY`` arrived (late answers to abandoned calls are ignored)."""
        call = self._calls.get(req)
        if call is not None:
            call.payload = payload
            call.done.set()

    def peer_gone(self, peer: int) -> None:
        """The connection to ``peer`` closed: its unanswered calls will never be answered."""
        for call in self._calls.values():
            if call.peer == peer and not call.done.is_set():
                call.lost = True
                call.done.set()

    def abandon_replaced(
        self, leader_of: Callable[[str], int | None], hears: Callable[[int], bool]
    ) -> int:
        """End every unanswered call to a partition's leader whose broker is silent (``hears``
        is False: it stopped answering pings, as a paused broker does with its connection still
        open) while ``leader_of`` its partition now names another broker. Its ``finish`` raises
        ``LeaderReplaced``. Returns how many calls were ended.

        Cheap enough to run every tick: calls to brokers that answer cost one lookup each.
        """
        ended = 0
        silent: dict[int, bool] = {}
        for call in self._calls.values():
            if call.group is None or call.done.is_set():
                continue
            quiet = silent.get(call.peer)
            if quiet is None:
                quiet = silent[call.peer] = not hears(call.peer)
            if not quiet:
                continue
            leader = leader_of(call.group)
            if leader is not None and leader != call.peer:
                call.replaced = True
                call.done.set()
                ended += 1
        return ended

    def reply(self, peer: int, req: int, payload: Any) -> None:
        """Answer request ``req`` of ``peer`` (dropped, and logged, if the peer is gone)."""
        if not self._send(peer, [REPLY, req, payload]):
            log.info("could not answer request %d of broker %d: not connected", req, peer)
