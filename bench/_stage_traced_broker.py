"""A ``kafkaesque broker`` process that records when each stage of a write happens in it.

    python -m bench._stage_traced_broker TRACE_FILE broker --id 0 ...

Everything after ``TRACE_FILE`` is the ``kafkaesque`` command line. The driver's methods are
wrapped (in this process only) to append ``(time_ns, stage, log_id, index, peer)`` to a list:
``time_ns`` is ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process of the
machine, so stages of different brokers and of the client line up). SIGUSR1 clears the list and
starts recording; SIGUSR2 stops and writes it to ``TRACE_FILE`` as JSON lines (atomically).

Stages, each with the highest log index it covers (so a write at offset ``o`` reached a stage at
the first record of that stage with ``index >= o``; batching needs no special case):

* ``propose``: the leader appended a batch to its Raft log (``index`` its last offset);
* ``ae_sent``: AppendEntries with entries queued to ``peer`` (the last entry's index);
* ``ae_recv``: a follower stepped AppendEntries with entries from ``peer``;
* ``durable``: a round's fsync ended with this group's entries (leader and follower alike);
* ``ack_sent``: a follower queued its successful answer (``index``: its match);
* ``ack_recv``: the leader stepped a follower's successful answer;
* ``commit``: the group's commit index moved here (the leader's, or a follower's learning it:
  ``RaftReplica._notify``, which wakes replies and long polls);
* ``flush``: the driver's queued peer messages went to the sockets (``index`` -1, every group).

Wrapping costs a little CPU per event; stage *deltas* are what this is for.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ._instrumented_broker import run_instrumented

Event = tuple[int, str, str, int, int]


def install(trace_file: str) -> None:
    """Wrap the driver's stage points; SIGUSR1 starts a recording, SIGUSR2 writes it."""
    from kafkaesque.raft import AppendEntries, AppendEntriesResponse, from_wire
    from kafkaesque.raft.driver import MultiRaft, PeerTransport, RaftReplica

    events: list[Event] = []
    on = [False]
    now = time.monotonic_ns

    def rec(stage: str, log_id: str, index: int, peer: int = -1) -> None:
        if on[0]:
            events.append((now(), stage, log_id, index, peer))

    m: Any = MultiRaft  # wrapped private methods: a diagnostic of this process only

    propose: Callable[..., int] = m._propose

    def _propose(self: Any, replica: Any, batch: Any, count: int) -> int:
        last = propose(self, replica, batch, count)
        rec("propose", replica.id, last)
        return last

    send_messages: Callable[..., None] = m._send_messages

    def _send_messages(self: Any, replica: Any, rd: Any) -> None:
        send_messages(self, replica, rd)
        for msg in rd.messages:
            if type(msg) is AppendEntries and msg.entries:
                rec("ae_sent", replica.id, msg.entries[-1].last, msg.dst)
            elif type(msg) is AppendEntriesResponse and msg.success:
                rec("ack_sent", replica.id, msg.index, msg.dst)

    handle: Callable[..., None] = m._handle_items

    def _handle_items(self: Any, peer: int, items: list[Any]) -> None:
        if on[0]:
            for item in items:
                if item and item[0] == 0:
                    msg = from_wire(item[2])
                    if type(msg) is AppendEntries and msg.entries:
                        rec("ae_recv", item[1], msg.entries[-1].last, peer)
                    elif type(msg) is AppendEntriesResponse and msg.success:
                        rec("ack_recv", item[1], msg.index, peer)
        handle(self, peer, items)

    collect: Callable[..., None] = m._collect

    def _collect(self: Any) -> None:
        rnd = self._round
        collect(self)
        if rnd is not None and self._round is not rnd:
            for replica, rd, _ in rnd.readies:
                if rd.entries:
                    rec("durable", replica.id, rd.entries[-1].last)

    r: Any = RaftReplica
    notify: Callable[..., None] = r._notify

    def _notify(self: Any) -> None:
        rec("commit", self.id, self.commit_index)  # (also on cuts: "first covering" skips them)
        notify(self)

    p: Any = PeerTransport
    flush: Callable[..., None] = p.flush

    def _flush(self: Any) -> None:
        flush(self)
        rec("flush", "", -1)

    m._propose = _propose
    m._send_messages = _send_messages
    m._handle_items = _handle_items
    m._collect = _collect
    r._notify = _notify
    p.flush = _flush

    def start(signum: int, frame: FrameType | None) -> None:
        events.clear()
        on[0] = True

    def stop(signum: int, frame: FrameType | None) -> None:
        on[0] = False
        part = trace_file + ".part"
        with open(part, "w") as f:
            for e in events:
                f.write(json.dumps(e) + "\n")
        os.replace(part, trace_file)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def main() -> int:
    return run_instrumented("bench._stage_traced_broker", "TRACE_FILE", install)


if __name__ == "__main__":
    sys.exit(main())
