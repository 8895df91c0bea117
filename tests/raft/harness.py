"""Small helpers for unit tests: build nodes, drive Readies, pass messages by hand."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from kafkaesque.raft import (
    Configuration,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    Message,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
)


def entry(term: int, first: int, last: int | None = None, data: bytes = b"x") -> Entry:
    """A DATA entry (``last`` defaults to ``first``)."""
    return Entry(term, first, first if last is None else last, EntryKind.DATA, data)


def storage_with(
    voters: Sequence[int],
    entries: Iterable[Entry] = (),
    hard: HardState | None = None,
    learners: Sequence[int] = (),
) -> MemoryStorage:
    """A disk seeded with a configuration, entries and a hard state."""
    disk = MemoryStorage(Configuration.of(voters, learners))
    disk.append(list(entries))
    if hard is not None:
        disk.set_hard_state(hard)
    return disk


def node(
    node_id: int,
    voters: Sequence[int] = (1, 2, 3),
    *,
    disk: MemoryStorage | None = None,
    seed: int = 0,
    **config: object,
) -> tuple[RaftNode, MemoryStorage]:
    """A node over a fresh (or given) disk."""
    disk = disk if disk is not None else storage_with(voters)
    cfg = RaftConfig(node_id, **config)  # type: ignore[arg-type]
    return RaftNode(cfg, disk, random.Random(seed)), disk


def drain(n: RaftNode, disk: MemoryStorage) -> list[Message]:
    """Process every Ready as a driver does (persist, send, advance); return the messages."""
    out: list[Message] = []
    while n.has_ready():
        rd = n.ready()
        # has_ready() promised work: an empty Ready would cost a driver a whole step for nothing.
        assert not rd.is_empty(), n.status()
        disk.persist(rd)
        out.extend(rd.messages)
        n.advance(rd)
    return out


def take_ready(n: RaftNode, disk: MemoryStorage) -> Ready:
    """Process exactly one Ready and return it (for assertions on its contents)."""
    rd = n.ready()
    disk.persist(rd)
    n.advance(rd)
    return rd


T = TypeVar("T")


def of_type(msgs: Iterable[Message], cls: type[T]) -> list[T]:
    """The messages of one type."""
    return [m for m in msgs if isinstance(m, cls)]


Filter = Callable[[Message], bool]


class Net:
    """A few nodes and a perfect, instantaneous network with optional drop rules."""

    def __init__(
        self,
        ids: Sequence[int] = (1, 2, 3),
        voters: Sequence[int] | None = None,
        disks: dict[int, MemoryStorage] | None = None,
        **config: object,
    ) -> None:
        voters = list(ids) if voters is None else voters
        self.nodes: dict[int, RaftNode] = {}
        self.disks: dict[int, MemoryStorage] = {}
        for i in ids:
            disk = (disks or {}).get(i) or storage_with(voters)
            self.nodes[i], self.disks[i] = node(i, voters, disk=disk, seed=i, **config)
        self.drops: list[Filter] = []
        self.sent: list[Message] = []

    def isolate(self, node_id: int) -> None:
        """Drop every message to or from ``node_id``."""
        self.drops.append(lambda m: node_id in (m.src, m.dst))

    def heal(self) -> None:
        """Drop nothing."""
        self.drops.clear()

    def stabilize(self, limit: int = 10_000) -> None:
        """Deliver messages until none are left."""
        for _ in range(limit):
            msgs: list[Message] = []
            for i, n in self.nodes.items():
                msgs.extend(drain(n, self.disks[i]))
            if not msgs:
                return
            for m in msgs:
                self.sent.append(m)
                if m.dst in self.nodes and not any(drop(m) for drop in self.drops):
                    self.nodes[m.dst].step(m)
        raise AssertionError("the network did not settle")

    def tick(self, node_id: int, times: int = 1) -> None:
        """Tick one node ``times`` times, stabilizing after each tick."""
        for _ in range(times):
            self.nodes[node_id].tick()
            self.stabilize()

    def tick_all(self, times: int = 1) -> None:
        """Tick every node ``times`` times, stabilizing after each round."""
        for _ in range(times):
            for n in self.nodes.values():
                n.tick()
            self.stabilize()

    def elect(self, node_id: int) -> RaftNode:
        """Make ``node_id`` campaign and settle; it must win."""
        self.nodes[node_id].campaign()
        self.stabilize()
        leader = self.nodes[node_id]
        assert leader.role is Role.LEADER, leader.status()
        return leader

    def propose(self, node_id: int, data: bytes = b"d", count: int = 1) -> int:
        """Propose at a node and settle."""
        index = self.nodes[node_id].propose(data, count)
        self.stabilize()
        return index
