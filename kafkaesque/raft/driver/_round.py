"""Group commit: the Readys of one round, and what decides and does their durability work.

A round writes the Readys of every marked group, then makes them durable as ONE job: its logs'
fsyncs in the fsync helper process, or, when the hard state is saved too, ``make_durable`` on a
worker thread (``FsyncWorkers``); ``MultiRaft`` starts and ends rounds (see its module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafkaesque.storage import FlushTicket, PartitionLog

from .. import AppendEntries, HardState, Heartbeat, Ready
from ._hard_state_store import HardStateStore
from ._replica import RaftReplica


@dataclass(eq=False, slots=True)
class Round:
    """Readys written to their logs, waiting for their durability work to end."""

    readies: list[tuple[RaftReplica, Ready, bool]]  # (group, Ready, its messages already sent)
    tickets: list[tuple[PartitionLog, FlushTicket]]  # the fsyncs, by log
    hard_states: bool  # whether the hard-state file is written too
    started: float


def replicates_only(rd: Ready, persisted: HardState) -> bool:
    """Whether ``rd``'s messages may be sent before ``rd`` is durable: they are all a leader's
    AppendEntries and heartbeats, and the Ready changes neither term nor vote."""
    if not rd.messages:
        return False
    hard = rd.hard_state
    if hard is not None and (hard.term, hard.vote) != (persisted.term, persisted.vote):
        return False
    for m in rd.messages:  # noqa: SIM110 (a loop, not all(): called for every Ready)
        if type(m) not in _REPLICATION:
            return False
    return True


_REPLICATION = (AppendEntries, Heartbeat)


def make_durable(
    tickets: list[FlushTicket], hard_states: HardStateStore, snapshot: dict[str, Any]
) -> None:
    """A round's durability job when it saves the hard state, on a worker thread: its logs'
    fsyncs, then the hard-state file (``snapshot``, taken on the event loop)."""
    for ticket in tickets:
        ticket.run()
    hard_states.write(snapshot)


__all__ = ["Round", "make_durable", "replicates_only"]
