"""One Kafka consumer group of the classic protocol, as its coordinator keeps it: a state machine.

Kafka's classic protocol (KIP-62, KIP-345, KIP-394; Kafka's ``GroupCoordinator``) assigns on the
client: the coordinator gathers the members (JoinGroup), picks a protocol every member supports
and a leader, hands the leader everyone's subscription metadata, takes the leader's assignment
(SyncGroup) and hands each member its part. Its states, with Kafka's names:

* ``Empty``: no members (maybe committed offsets);
* ``PreparingRebalance``: a join or a departure started a rebalance; it completes when every
  member has sent JoinGroup again, or at the rebalance deadline (the largest rebalance timeout of
  the members), when the members that did not rejoin are dropped; a new group waits
  ``initial_delay_s`` first, so that members starting together join one generation;
* ``CompletingRebalance``: the new generation is formed; waiting for the leader's SyncGroup;
* ``Stable``: every member has its assignment; Heartbeats keep the members alive.

A member that is not waiting in a JoinGroup or SyncGroup is dropped when the coordinator has not
heard from it (JoinGroup, SyncGroup, Heartbeat, OffsetCommit) for its session timeout. Static
members (``group.instance.id``, KIP-345) keep their place across restarts: a JoinGroup with a
known instance id replaces the old member id (which is fenced from then on) and, in a Stable
group whose metadata did not change, gets the current generation back without a rebalance.
From JoinGroup v4 a new member without an id gets one with MEMBER_ID_REQUIRED and joins with it
(KIP-394), so a client that retries after a timeout does not leave a ghost member behind.

Pure but for ``trio.Event`` (a waiting request is a ``Pending`` the coordinator awaits): every
method takes ``now`` (seconds, the caller's clock) and answers at once, or returns the
``Pending`` that a later event answers. ``saved`` is what the coordinator writes to the log
whenever a generation is formed and handed out (or the group empties), and ``restored`` what a
new coordinator makes of it: the same generation, members and assignments, each member given
one session from then (Kafka's group metadata and its loading), so a coordinator failover costs
no rebalance. A generation still forming when the coordinator fails is lost: its members
rejoin.
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import trio

from kafkaesque.protocol.kafka import KafkaError, Message

MIN_SESSION_TIMEOUT_S: Final = 6.0  # Kafka's group.min.session.timeout.ms
MAX_SESSION_TIMEOUT_S: Final = 1800.0  # Kafka's group.max.session.timeout.ms


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Pending:
    """A request that waits for the group: ``answer`` is set once, then ``done`` is."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Message = {}

    def give(self, answer: Message) -> None:
        if not self.done.is_set():
            self.answer = answer
            self.done.set()


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    deadline: float
    assignment: bytes = b""
    joining: Pending | None = None
    syncing: Pending | None = None

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A JoinGroup, as the state machine needs it (``version``: the request's)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    version: int

    def member(self, member_id: str, now: float) -> Member:
        """The member this request makes, as ``member_id``, heard from ``now``."""
        return Member(
            member_id,
            self.instance_id,
            self.client_id,
            self.client_host,
            self.session_timeout_s,
            self.rebalance_timeout_s,
            self.protocol_type,
            self.protocols,
            deadline=now + self.session_timeout_s,
        )


@dataclass
class ClassicGroup:
    """One group (see the module docstring). ``initial_delay_s``: how long a rebalance of an
    empty group waits for more members (Kafka's group.initial.rebalance.delay.ms)."""

    group_id: str
    initial_delay_s: float = 0.0
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    fenced: set[str] = field(default_factory=set)  # member ids a static rejoin replaced
    pending_ids: dict[str, float] = field(default_factory=dict)  # KIP-394 ids, by deadline
    rebalance_deadline: float = 0.0
    delay_until: float = 0.0

    # -- JoinGroup ------------------------------------------------------------------------------

    def join(self, request: JoinRequest, now: float) -> Message | Pending:
        """A JoinGroup: the error answer at once, or the Pending the rebalance answers."""
        if not MIN_SESSION_TIMEOUT_S <= request.session_timeout_s <= MAX_SESSION_TIMEOUT_S:
            return join_error(KafkaError.INVALID_SESSION_TIMEOUT, request.member_id)
        if not request.protocol_type or not request.protocols:
            return join_error(KafkaError.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        if self.members and (
            request.protocol_type != self.protocol_type
            or not self._common_protocols(request.protocols, except_member=request.member_id)
        ):
            return join_error(KafkaError.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        member_id = request.member_id
        if request.instance_id is not None:
            known = self.static.get(request.instance_id)
            if member_id and known is not None and member_id != known:
                return join_error(KafkaError.FENCED_INSTANCE_ID, member_id)
            if not member_id and known is not None:
                return self._rejoin_static(request, known, now)
            if not member_id:
                member_id = _new_member_id(request.client_id)
        elif not member_id:
            member_id = _new_member_id(request.client_id)
            if request.version >= 4:  # KIP-394: the client joins again with this id
                self.pending_ids[member_id] = now + request.session_timeout_s
                return join_error(KafkaError.MEMBER_ID_REQUIRED, member_id)
        elif member_id not in self.members and self.pending_ids.pop(member_id, None) is None:
            return join_error(KafkaError.UNKNOWN_MEMBER_ID, member_id)
        member = self.members.get(member_id)
        if member is None:
            # As Kafka's GroupMetadata.add: the first member of an empty group sets its protocol
            # type (an empty group keeps its last one, which ListGroups and DescribeGroups show:
            # a stopped Connect cluster's group stays "connect").
            if not self.members:
                self.protocol_type = request.protocol_type
            member = self.members[member_id] = request.member(member_id, now)
            if request.instance_id is not None:
                self.static[request.instance_id] = member_id
            changed = True
        else:
            changed = member.protocols != request.protocols
            member.protocols = request.protocols
            member.session_timeout_s = request.session_timeout_s
            member.rebalance_timeout_s = request.rebalance_timeout_s
            member.deadline = now + request.session_timeout_s
        if (
            self.state is GroupState.STABLE
            and not changed
            and member_id != self.leader
            and member.joining is None
        ):
            # A follower that rejoins with nothing new (it lost the JoinGroup answer, say):
            # the current generation is its answer, as in Kafka.
            return self._join_answer(member)
        pending = Pending()
        if member.joining is not None:  # the client gave up on its earlier JoinGroup
            member.joining.give(join_error(KafkaError.UNKNOWN_MEMBER_ID, member_id))
        member.joining = pending
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        self.tick(now)
        return pending

    def _rejoin_static(self, request: JoinRequest, old_id: str, now: float) -> Message | Pending:
        """A static member restarted (it joins with its instance id and no member id): it
        takes its old place under a new id, and the old id is fenced."""
        old = self.members.pop(old_id, None)
        new_id = _new_member_id(request.client_id)
        self.fenced.add(old_id)
        self.static[request.instance_id or ""] = new_id
        member = self.members[new_id] = request.member(new_id, now)
        member.assignment = b"" if old is None else old.assignment
        if old is not None:
            for waiting in (old.joining, old.syncing):
                if waiting is not None:
                    waiting.give(join_error(KafkaError.FENCED_INSTANCE_ID, old_id))
        if self.leader == old_id:
            self.leader = new_id
        same = old is not None and old.protocols == request.protocols
        if self.state is GroupState.STABLE and same and self.leader != new_id:
            return self._join_answer(member)
        member.joining = pending = Pending()
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now)
        self.tick(now)
        return pending

    def _common_protocols(
        self, protocols: list[tuple[str, bytes]], except_member: str = ""
    ) -> set[str]:
        names = {name for name, _ in protocols}
        for m in self.members.values():
            if m.member_id != except_member:
                names &= {name for name, _ in m.protocols}
        return names

    def _prepare_rebalance(self, now: float) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            for m in self.members.values():
                if m.syncing is not None:
                    m.syncing.give(_sync_error(KafkaError.REBALANCE_IN_PROGRESS))
                    m.syncing = None
        if self.state is GroupState.EMPTY:
            self.delay_until = now + self.initial_delay_s
        self.state = GroupState.PREPARING_REBALANCE
        longest = max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)
        self.rebalance_deadline = now + longest

    def _complete_join(self, now: float) -> None:
        """Every member rejoined (or the deadline passed): form the next generation."""
        for member_id in [m for m, member in self.members.items() if member.joining is None]:
            self._remove(member_id)
        self.generation += 1
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol = self.leader = None  # the protocol type stays (Kafka's rule)
            return
        self.state = GroupState.COMPLETING_REBALANCE
        self.protocol = self._choose_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        for member in self.members.values():
            member.deadline = now + member.session_timeout_s
            member.assignment = b""
            waiting, member.joining = member.joining, None
            if waiting is not None:
                waiting.give(self._join_answer(member))

    def _choose_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote: each
        member votes for its first choice among the common ones)."""
        common: set[str] | None = None
        for m in self.members.values():
            names = {name for name, _ in m.protocols}
            common = names if common is None else common & names
        assert common, "a member was admitted without a protocol in common"
        votes = Counter(
            next(name for name, _ in m.protocols if name in common) for m in self.members.values()
        )
        return max(sorted(votes), key=lambda name: votes[name])

    def _join_answer(self, member: Member) -> Message:
        leader = member.member_id == self.leader
        return {
            "error_code": KafkaError.NONE,
            "generation_id": self.generation,
            "protocol_name": self.protocol or "",
            "leader": self.leader or "",
            "member_id": member.member_id,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "metadata": m.metadata(self.protocol),
                }
                for m in self.members.values()
            ]
            if leader
            else [],
        }

    # -- SyncGroup, Heartbeat, LeaveGroup -------------------------------------------------------

    def sync(
        self,
        member_id: str,
        instance_id: str | None,
        generation: int,
        assignments: dict[str, bytes],
        now: float,
    ) -> Message | Pending:
        error = self._check_member(member_id, instance_id, generation)
        if error is not KafkaError.NONE:
            return _sync_error(error)
        member = self.members[member_id]
        member.deadline = now + member.session_timeout_s
        if self.state is GroupState.PREPARING_REBALANCE:
            return _sync_error(KafkaError.REBALANCE_IN_PROGRESS)
        if self.state is GroupState.STABLE:
            return {"error_code": KafkaError.NONE, "assignment": member.assignment}
        pending = Pending()
        if member.syncing is not None:
            member.syncing.give(_sync_error(KafkaError.REBALANCE_IN_PROGRESS))
        member.syncing = pending
        if member_id == self.leader:
            for m in self.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            self.state = GroupState.STABLE
            for m in self.members.values():
                waiting, m.syncing = m.syncing, None
                if waiting is not None:
                    waiting.give({"error_code": KafkaError.NONE, "assignment": m.assignment})
        return pending

    def heartbeat(
        self, member_id: str, instance_id: str | None, generation: int, now: float
    ) -> KafkaError:
        error = self._check_member(member_id, instance_id, generation)
        if error is not KafkaError.NONE:
            return error
        member = self.members[member_id]
        member.deadline = now + member.session_timeout_s
        if self.state is GroupState.PREPARING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        return KafkaError.NONE

    def leave(self, member_id: str, instance_id: str | None, now: float) -> KafkaError:
        """A member leaves (by id, or a static member by instance id, as an admin's removal)."""
        if instance_id is not None:
            known = self.static.get(instance_id)
            if known is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if member_id and member_id != known:
                return KafkaError.FENCED_INSTANCE_ID
            member_id = known
        if member_id not in self.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._drop(member_id, now)
        return KafkaError.NONE

    def commit_error(
        self, member_id: str, instance_id: str | None, generation: int, now: float
    ) -> KafkaError:
        """Whether this member may commit offsets now (Kafka's rules: a commit without a
        generation (-1) is a client outside group management, allowed only while the group
        has no members; a member commits in its generation, not while it is being formed)."""
        if generation < 0 and not member_id:
            return KafkaError.NONE if not self.members else KafkaError.UNKNOWN_MEMBER_ID
        error = self._check_member(member_id, instance_id, generation)
        if error is not KafkaError.NONE:
            return error
        if self.state is GroupState.COMPLETING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        member = self.members[member_id]
        member.deadline = now + member.session_timeout_s
        return KafkaError.NONE

    def _check_member(self, member_id: str, instance_id: str | None, generation: int) -> KafkaError:
        if member_id in self.fenced or (
            instance_id is not None and self.static.get(instance_id, member_id) != member_id
        ):
            return KafkaError.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return KafkaError.ILLEGAL_GENERATION
        return KafkaError.NONE

    # -- time -----------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Drop the members past their session, forget unused KIP-394 ids, and complete a
        rebalance that has everyone (after the initial delay) or has reached its deadline."""
        for pending_id, deadline in list(self.pending_ids.items()):
            if deadline <= now:
                del self.pending_ids[pending_id]
        for member in list(self.members.values()):
            if member.member_id not in self.members:
                continue  # dropped meanwhile (a drop ticks, and may drop others)
            waiting = member.joining is not None or member.syncing is not None
            if not waiting and member.deadline <= now:
                self._drop(member.member_id, now)
        if self.state is GroupState.PREPARING_REBALANCE:
            everyone = all(m.joining is not None for m in self.members.values())
            if (everyone and now >= self.delay_until) or now >= self.rebalance_deadline:
                self._complete_join(now)

    def _drop(self, member_id: str, now: float) -> None:
        """Remove a member that left or expired, and rebalance the others."""
        member = self._remove(member_id)
        for waiting in (member.joining, member.syncing):
            if waiting is not None:
                waiting.give(join_error(KafkaError.UNKNOWN_MEMBER_ID, member_id))
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now)
        if self.state is GroupState.PREPARING_REBALANCE:
            self.tick(now)

    def _remove(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        if member.instance_id is not None and self.static.get(member.instance_id) == member_id:
            del self.static[member.instance_id]
        return member

    def next_deadline(self) -> float | None:
        """When ``tick`` may next change something (None: nothing is timed)."""
        times = [m.deadline for m in self.members.values()]
        times += list(self.pending_ids.values())
        if self.state is GroupState.PREPARING_REBALANCE:
            times += [self.rebalance_deadline, self.delay_until]
        return min(times, default=None)

    # -- the log's copy -------------------------------------------------------------------------

    def saved_key(self) -> tuple[int, tuple[str, ...]] | None:
        """What identifies the membership ``saved`` would write: None while a generation is
        being formed (nothing to save)."""
        if self.state not in (GroupState.STABLE, GroupState.EMPTY):
            return None
        return self.generation, tuple(self.members)

    def saved(self) -> dict[str, Any]:
        """The group's membership as the log keeps it (msgpack-able)."""
        return {
            "generation": self.generation,
            "protocol_type": self.protocol_type,
            "protocol": self.protocol,
            "leader": self.leader,
            "members": [
                [
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.client_host,
                    m.session_timeout_s,
                    m.rebalance_timeout_s,
                    m.metadata(self.protocol),
                    m.assignment,
                ]
                for m in self.members.values()
            ],
        }

    @staticmethod
    def saved_protocol_type(saved: dict[str, Any]) -> str:
        """The protocol type in a membership ``saved`` wrote ("" if none was ever set)."""
        return saved.get("protocol_type") or ""

    @classmethod
    def restored(
        cls, group_id: str, saved: dict[str, Any], now: float, initial_delay_s: float = 0.0
    ) -> ClassicGroup:
        """The group ``saved`` describes, each member's session starting ``now``."""
        group = cls(
            group_id,
            initial_delay_s,
            generation=saved["generation"],
            protocol_type=saved["protocol_type"],
            protocol=saved["protocol"],
            leader=saved["leader"],
        )
        for member_id, instance, client, host, session_s, rebalance_s, meta, assigned in saved[
            "members"
        ]:
            group.members[member_id] = Member(
                member_id,
                instance,
                client,
                host,
                session_s,
                rebalance_s,
                group.protocol_type or "",
                [(group.protocol or "", meta)],
                deadline=now + session_s,
                assignment=assigned,
            )
            if instance is not None:
                group.static[instance] = member_id
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        return group

    # -- DescribeGroups -------------------------------------------------------------------------

    def describe(self) -> Message:
        stable = self.state is GroupState.STABLE
        return {
            "error_code": KafkaError.NONE,
            "group_id": self.group_id,
            "group_state": str(self.state),
            "protocol_type": self.protocol_type or "",
            "protocol_data": self.protocol or "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata(self.protocol),
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in self.members.values()
            ],
        }

    def close(self, error: KafkaError) -> None:
        """The coordinator gives the group up (it no longer leads its partition): every
        waiting request gets ``error``."""
        self.state = GroupState.DEAD
        for m in self.members.values():
            for waiting in (m.joining, m.syncing):
                if waiting is not None:
                    waiting.give({"error_code": error, "member_id": m.member_id})


def _new_member_id(client_id: str) -> str:
    """As Kafka's: the client id, a dash, a random UUID-like suffix."""
    return f"{client_id or 'member'}-{secrets.token_hex(16)}"


def join_error(error: KafkaError, member_id: str) -> Message:
    """A JoinGroup answer that refuses ``member_id`` with ``error``."""
    return {"error_code": error, "generation_id": -1, "member_id": member_id, "members": []}


def _sync_error(error: KafkaError) -> Message:
    return {"error_code": error, "assignment": b""}
