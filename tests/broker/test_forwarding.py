"""``Forwarder``: a call to a partition's leader that went silent and was replaced ends at once.

Issue 23: a broker paused by SIGSTOP keeps its connections open, so nothing closes and no answer
comes; writes forwarded to it waited out their whole deadline while a new leader had long been
elected. The call now ends with ``LeaderReplaced`` (outcome unknown), and the write path answers
the retriable ``TIMEOUT`` instead of appending the batch a second time blindly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._forwarding import (
    APPEND,
    COMMAND,
    FIND_RESEND,
    Forwarder,
    LeaderReplaced,
    _Call,
)
from kafkaesque.broker._leaders import Claim, LeaderTable
from kafkaesque.broker._writes import WritePath
from kafkaesque.protocol import Acks, ErrorCode
from kafkaesque.raft._driver import MultiRaft
from kafkaesque.storage import Record, build_batch

PAUSED = 2


def _claim(term: int) -> Claim:
    return Claim(term, frozenset({0, 1, 2}), frozenset(), True)


def _hears(peer: int) -> bool:
    return peer != PAUSED


class Wire:
    """The transport's ``send``: records what went where."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[Any]]] = []

    def send(self, peer: int, item: list[Any]) -> bool:
        self.sent.append((peer, item))
        return True


async def _ends_within(call: _Call, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        await call.done.wait()
        return True
    return False


async def test_only_calls_to_a_silent_replaced_leader_are_ended() -> None:
    forwarder = Forwarder(Wire().send)
    leaders = {"t/0": 1, "t/1": PAUSED}  # t/0 has a new leader; t/1 none yet
    replaced = forwarder.start(PAUSED, APPEND, "t/0", b"batch", 1, 1, 5.0)
    waiting = forwarder.start(PAUSED, APPEND, "t/1", b"batch", 1, 1, 5.0)
    resend = forwarder.start(PAUSED, FIND_RESEND, "t/0", b"c", b"p", 7, 5.0)
    live = forwarder.start(0, APPEND, "t/0", b"batch", 1, 1, 5.0)  # its answer will come
    command = forwarder.start(PAUSED, COMMAND, b"GROUPS")  # not a partition's: untouched

    assert forwarder.abandon_replaced(leaders.get, _hears) == 2
    assert replaced[1].done.is_set() and resend[1].done.is_set()
    assert not any(c.done.is_set() for _, c in (waiting, live, command))
    deadline = trio.current_time() + 30
    with pytest.raises(LeaderReplaced, match="outcome is unknown"):
        await forwarder.finish(*replaced, deadline)
    # Once its partition has a new leader, the second one ends too.
    leaders["t/1"] = 0
    assert forwarder.abandon_replaced(leaders.get, _hears) == 1
    assert await _ends_within(waiting[1], 1)
    # A late answer from the resumed broker is ignored; the live broker's answer is taken.
    forwarder.answered(waiting[0], ["ok", 5, 5])
    with pytest.raises(LeaderReplaced):
        await forwarder.finish(*waiting, deadline)
    forwarder.answered(live[0], ["ok", 3, 3])
    assert await forwarder.finish(*live, deadline) == ["ok", 3, 3]


async def test_a_write_forwarded_to_a_replaced_leader_is_answered_timeout_not_resent(
    tmp_path: Path,
) -> None:
    wire = Wire()
    forwarder = Forwarder(wire.send)
    table = LeaderTable()
    table.report(PAUSED, {"t/0": _claim(3)})
    raft = MultiRaft(0, wire.send, state_dir=str(tmp_path))  # hosts no replica of t/0
    writes = WritePath(0, raft, table, forwarder, timeout=30.0)
    batch = build_batch([Record(value=b"x")])
    outcome: list[BaseException] = []

    async def write() -> None:
        try:
            await writes.write("t/0", batch, 1, Acks.QUORUM)
        except RequestError as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert [(peer, item[0]) for peer, item in wire.sent] == [(PAUSED, APPEND)]
        table.report(1, {"t/0": _claim(4)})  # a new leader, and broker 2 stays silent
        started = trio.current_time()
        forwarder.abandon_replaced(writes.leader_of, _hears)
    assert trio.current_time() - started < 5  # not the 30 s deadline
    (error,) = outcome
    assert isinstance(error, RequestError) and error.code is ErrorCode.TIMEOUT
    assert error.code.retriable
    # The batch was not sent again to the new leader: it may already be in its log.
    assert [(peer, item[0]) for peer, item in wire.sent] == [(PAUSED, APPEND)]
    raft.close()
