"""Membership: the set of voters and learners of one Raft group.

Changes go one server at a time (Ongaro's thesis §4.1): add a learner, promote a caught-up learner
to voter, or remove a member. Any two majorities of configurations that differ by one voter
overlap, so no joint consensus is needed. A configuration takes effect on a node as soon as its
CONFIG entry is appended to that node's log (committed or not) and is undone if that entry is
truncated; the core keeps that history (see ``RaftNode``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from ._errors import InvalidConfigChange, MalformedMessage


@dataclass(frozen=True, slots=True)
class Configuration:
    """Voters elect and count for commit; learners only receive the log."""

    voters: frozenset[int] = frozenset()
    learners: frozenset[int] = frozenset()  # Invariant: disjoint from voters.

    def __post_init__(self) -> None:
        if self.voters & self.learners:
            raise ValueError(f"nodes {sorted(self.voters & self.learners)} are voter and learner")

    @classmethod
    def of(cls, voters: Sequence[int], learners: Sequence[int] = ()) -> Configuration:
        """Build from sequences (a convenience for callers and tests)."""
        return cls(frozenset(voters), frozenset(learners))

    @property
    def members(self) -> frozenset[int]:
        """Voters and learners."""
        return self.voters | self.learners

    def add_learner(self, node: int) -> Configuration:
        """The configuration with ``node`` added as a learner.

        Raises:
            InvalidConfigChange: ``node`` is already a member.
        """
        if node in self.members:
            raise InvalidConfigChange(f"node {node} is already a member")
        return Configuration(self.voters, self.learners | {node})

    def promote(self, node: int) -> Configuration:
        """The configuration with learner ``node`` made a voter.

        Raises:
            InvalidConfigChange: ``node`` is not a learner.
        """
        if node not in self.learners:
            raise InvalidConfigChange(f"node {node} is not a learner")
        return Configuration(self.voters | {node}, self.learners - {node})

    def remove(self, node: int) -> Configuration:
        """The configuration without ``node``.

        Raises:
            InvalidConfigChange: ``node`` is not a member, or is the last voter.
        """
        if node not in self.members:
            raise InvalidConfigChange(f"node {node} is not a member")
        if self.voters == {node}:
            raise InvalidConfigChange(f"node {node} is the last voter")
        return Configuration(self.voters - {node}, self.learners - {node})

    def to_wire(self) -> list[list[int]]:
        """``[sorted voters, sorted learners]``: msgpack-encodable and canonical."""
        return [sorted(self.voters), sorted(self.learners)]

    @classmethod
    def from_wire(cls, obj: object) -> Configuration:
        """Inverse of ``to_wire``.

        Raises:
            MalformedMessage: ``obj`` is not ``[voters, learners]`` of distinct ints.
        """
        if not isinstance(obj, list | tuple) or len(obj) != 2:
            raise MalformedMessage(f"bad configuration {obj!r}")
        sets: list[frozenset[int]] = []
        for part in obj:
            if not isinstance(part, list | tuple) or not all(type(x) is int for x in part):
                raise MalformedMessage(f"bad configuration {obj!r}")
            sets.append(frozenset(part))
        try:
            return cls(sets[0], sets[1])
        except ValueError as exc:
            raise MalformedMessage(str(exc)) from exc

    def encode(self) -> bytes:
        """The payload of a CONFIG entry (msgpack of ``to_wire()``)."""
        data: bytes = msgpack.packb(self.to_wire())
        return data

    @classmethod
    def decode(cls, data: bytes) -> Configuration:
        """Inverse of ``encode``.

        Raises:
            MalformedMessage: the payload is not a configuration.
        """
        try:
            obj = msgpack.unpackb(data)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise MalformedMessage(f"undecodable configuration: {exc}") from exc
        return cls.from_wire(obj)

    def __str__(self) -> str:
        return f"voters={sorted(self.voters)} learners={sorted(self.learners)}"
