"""Requests between brokers, riding the Raft transport's connection to each peer.

A broker forwards what it cannot do itself: a write to the partition's leader, a read to a
broker that holds a replica, a command of the group-offsets partition to its leader. The
messages are ``kafkaesque.protocol``'s peer messages (frozen dataclasses, ``peer_to_wire`` /
``peer_from_wire``): a request goes out as ``PeerCall(req, request)``, its answer comes back as
``PeerReply(req, answer)``; they share each peer's one TCP connection with Raft's messages
(``PeerTransport``), told apart by their tags (``is_peer_item``).

Outcomes are kept apart as the error taxonomy demands: ``PeerUnavailable`` means the request was
never sent (nothing happened there: retry freely); ``ForwardTimeout``, ``PeerLost`` and
``LeaderReplaced`` mean it may or may not have been carried out.

A request for one partition (``AppendRequest``, ``FindResendRequest``) sent to its leader is not
waited on past that leader's replacement: a leader paused by SIGSTOP keeps its connection open
and answers nothing until it resumes (issue 23: writes waited out their whole deadline while a
new leader had long been elected). ``abandon_replaced``, run every few ticks, ends the calls
whose broker is silent (it stopped answering the Raft driver's pings) once another leader of
their partition is known. Only calls to a silent broker: a live old leader's own answer (done,
or "not the leader, retry") comes soon and is better news than "unknown".

A call's end can be told by callback (``on_done``) instead of awaited: the appender's batch
forwarded to the leader then finishes from the task that reads the leader's answer, with no task
of its own waiting (``WritePath.when_written``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from kafkaesque.protocol import (
    Answer,
    AppendRequest,
    FindResendRequest,
    PeerCall,
    PeerReply,
    Request,
    peer_to_wire,
)

log = logging.getLogger("kafkaesque.broker.forwarding")


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


@dataclass(eq=False, slots=True)
class _Call:
    """One request sent. It ends once: answered (``answer``), ``lost`` or ``replaced``; then
    ``ended`` is True, ``wait`` returns and ``on_done``, if any, is called."""

    peer: int
    log_id: str | None = None  # the partition asked of its leader (append, find-resend)
    ended: bool = False
    answer: Answer | None = None
    lost: bool = False
    replaced: bool = False
    on_done: Callable[[], None] | None = None
    # Made only once someone awaits the end: a call told by callback needs none.
    _ended_event: trio.Event | None = None

    def end(self) -> None:
        """Mark the call ended (its outcome fields set), wake ``wait`` and tell ``on_done``."""
        self.ended = True
        if self._ended_event is not None:
            self._ended_event.set()
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done()

    async def wait(self) -> None:
        """Until the call ended (a checkpoint even if it has)."""
        if self.ended:
            await trio.lowlevel.checkpoint()
            return
        if self._ended_event is None:
            self._ended_event = trio.Event()
        await self._ended_event.wait()


class Forwarder:
    """Outgoing calls and their answers. Use from the broker's trio thread only.

    ``send(peer, item) -> bool`` is the transport's (False: not connected, dropped).
    """

    def __init__(self, send: Callable[[int, Any], bool]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}

    def start(self, peer: int, request: Request) -> tuple[int, _Call]:
        """Send a request now (so requests to one peer keep their order); await ``finish``.

        Raises ``PeerUnavailable`` if it could not be sent.
        """
        req = next(self._ids)
        if not self._send(peer, peer_to_wire(PeerCall(req, request))):
            raise PeerUnavailable(f"broker {peer} is not connected")
        log_id = request.log_id if isinstance(request, AppendRequest | FindResendRequest) else None
        call = _Call(peer, log_id)
        self._calls[req] = call
        return req, call

    async def finish(self, req: int, call: _Call, deadline: float) -> Answer:
        """The answer; ``ForwardTimeout``, ``PeerLost`` or ``LeaderReplaced`` when there is
        none. The call's ``on_done`` callback, if any, is dropped: its awaiter has it now."""
        call.on_done = None
        try:
            with trio.move_on_at(deadline):
                await call.wait()
        finally:
            self._calls.pop(req, None)
        if call.lost:
            raise PeerLost(f"the connection to broker {call.peer} closed before it answered")
        if call.replaced:
            raise LeaderReplaced(
                f"broker {call.peer} went silent and {call.log_id} has a new leader; "
                "the outcome is unknown"
            )
        if call.answer is None:
            raise ForwardTimeout(f"broker {call.peer} did not answer in time")
        return call.answer

    def on_done(self, call: _Call, callback: Callable[[], None]) -> None:
        """Call ``callback`` once ``call`` ends (answered, lost or replaced; at once if it has),
        from the task that ends it, in the middle of its work: it must be quick and must not
        raise. It reads the outcome from ``call``, or has a task await ``finish`` (which then
        returns or raises at once) for the usual taxonomy. Nothing here watches a deadline: a
        caller that has one awaits ``finish`` once it passes, which drops the callback (never
        called then) and raises ``ForwardTimeout``. Replaces an earlier callback of ``call``.
        """
        if call.ended:
            callback()
        else:
            call.on_done = callback

    async def call(self, peer: int, request: Request, *, deadline: float) -> Answer:
        """``start`` then ``finish``."""
        req, call = self.start(peer, request)
        return await self.finish(req, call, deadline)

    def answered(self, req: int, answer: Answer) -> None:
        """A ``PeerReply`` arrived (late answers to abandoned calls are ignored)."""
        # Popped here: a call told by callback may never be ``finish``ed (its pop is a no-op).
        call = self._calls.pop(req, None)
        if call is not None and not call.ended:
            call.answer = answer
            call.end()

    def peer_gone(self, peer: int) -> None:
        """The connection to ``peer`` closed: its unanswered calls will never be answered."""
        # Collected first: a callback may start new calls.
        gone = [c for c in self._calls.values() if c.peer == peer and not c.ended]
        for call in gone:
            call.lost = True
            call.end()

    def abandon_replaced(
        self, leader_of: Callable[[str], int | None], hears: Callable[[int], bool]
    ) -> int:
        """End every unanswered call to a partition's leader whose broker is silent (``hears``
        is False: it stopped answering pings, as a paused broker does with its connection still
        open) while ``leader_of`` its partition now names another broker. Its ``finish`` raises
        ``LeaderReplaced``. Returns how many calls were ended.

        Cheap enough to run every tick: calls to brokers that answer cost one lookup each.
        """
        ended: list[_Call] = []
        silent: dict[int, bool] = {}
        for call in self._calls.values():
            if call.log_id is None or call.ended:
                continue
            quiet = silent.get(call.peer)
            if quiet is None:
                quiet = silent[call.peer] = not hears(call.peer)
            if not quiet:
                continue
            leader = leader_of(call.log_id)
            if leader is not None and leader != call.peer:
                ended.append(call)
        for call in ended:  # after the loop: a callback may start new calls
            call.replaced = True
            call.end()
        return len(ended)

    def reply(self, peer: int, req: int, answer: Answer) -> None:
        """Answer request ``req`` of ``peer`` (dropped, and logged, if the peer is gone)."""
        if not self._send(peer, peer_to_wire(PeerReply(req, answer))):
            log.info("could not answer request %d of broker %d: not connected", req, peer)
