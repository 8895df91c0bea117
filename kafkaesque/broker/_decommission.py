"""Decommission: move every replica off a broker, then take it out of the registry and the
controller quorum (``REMOVEBROKER <id>``, ``kafkaesque broker remove <id>``).

The moves reuse the reassignment machinery (``REASSIGN``, :mod:`._membership`): the metadata
gets each partition's new replicas, the broker in it replaced by another one, and the group's
leader changes the Raft membership one server at a time (learner added, caught up, promoted,
the leaving broker removed; a leaving leader hands its leadership over first). Many groups
move at once, each one step at a time. Only when no group's committed membership holds the
leaving broker any more is it removed from the pysyncobj quorum (``removeNodeFromCluster``),
then from the registry (``withdraw_broker``). The broker process itself keeps running until
the operator stops it (``kafkaesque broker stop``).

pysyncobj's leader cannot remove itself (its ``__doChangeCluster`` ignores a removal of its own
node, so the change is denied). When the leaving broker leads the controller quorum, this broker
first asks it (``HandOverControllerRequest``, a peer message) to hand that leadership over as a
graceful shutdown does (``ClusterMetadata.hand_over_leadership``: pysyncobj's
``transferLeadership``, Raft TimeoutNow to an up-to-date follower, so the quorum is without a
leader for one round trip, not an election timeout), waits until its own replica sees another
leader, and removes it then. A hand-over that does not happen within ``HAND_OVER_TIMEOUT_S`` (no
other controller connected and up to date) is answered ``TIMEOUT``, saying why: the leaving
broker still leads, nothing is lost, and the command sent again carries on from there.

A broker cannot take its own controller out of the quorum (a removed pysyncobj follower is never
told: the leader drops its connection with the change). ``REMOVEBROKER`` sent to the leaving
broker itself is therefore carried out by another broker (``DecommissionRequest``, the
controller leader's broker when it is connected), which asks the leaving one to hand the lead
over if it has it, as above.

Refused, before anything changes, if a partition could not keep its replication factor: every
partition that holds the broker needs another registered broker that holds none of its
replicas. Every step is idempotent, so a decommission that timed out (its moves go on) is
finished by sending the command again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping

import trio

from kafkaesque.protocol import (
    ControllerHandOver,
    Decommissioned,
    DecommissionRequest,
    ErrorCode,
    HandOverControllerRequest,
    Refused,
)

from ._errors import RequestError
from ._forwarding import Forwarder, ForwardError, PeerUnavailable
from ._leaders import Claim
from ._metadata import ClusterMetadata
from ._metadata_view import TopicInfo

log = logging.getLogger("kafkaesque.broker.decommission")

DECOMMISSION_TIMEOUT_S = 300.0
"""How long ``REMOVEBROKER`` waits for the replicas to move before it answers ``TIMEOUT``."""

HAND_OVER_TIMEOUT_S = 5.0
"""How long the leaving broker, when it leads the controller quorum, may take to hand that
leadership over (it asks again every 50 ms while no follower is up to date) before
``REMOVEBROKER`` answers ``TIMEOUT``."""

# A hand-over request's round trip, and the new leader's first heartbeat reaching this replica.
_HAND_OVER_SLACK_S = 2.0
# What a delegated decommission may take beyond its own bounds: the quorum and registry changes.
_DELEGATE_SLACK_S = 60.0
# A peer's hand-over request never holds the receiver's task longer than this, whatever it asks.
_HAND_OVER_MAX_S = 60.0
_POLL_S = 0.1
_CONCURRENT_METADATA_CALLS = 16


def plan_removal(
    brokers: Collection[int], topics: Mapping[str, TopicInfo], leaving: int
) -> dict[tuple[str, int], tuple[int, ...]]:
    """The new replicas of every partition that holds ``leaving``, keyed by (topic, partition).

    Pure. ``leaving`` is replaced in place (a preferred replica by its replacement, so that
    preferred leaders stay spread) by the registered broker, not already a replica of the
    partition, that holds the fewest replicas so far (counting those planned; ties go to the
    lowest id). Raises ``ValueError`` naming the first partition (in name order) that has no such
    broker: removing ``leaving`` would leave it below its replication factor.
    """
    others = sorted(set(brokers) - {leaving})
    load: Counter[int] = Counter({b: 0 for b in others})
    for info in topics.values():
        for replicas in info.replicas:
            load.update(b for b in replicas if b in load)
    plan: dict[tuple[str, int], tuple[int, ...]] = {}
    for name in sorted(topics):
        for partition, replicas in enumerate(topics[name].replicas):
            if leaving not in replicas:
                continue
            candidates = [b for b in others if b not in replicas]
            if not candidates:
                raise ValueError(
                    f"removing broker {leaving} would leave {name}/{partition} with "
                    f"{len(replicas) - 1} replicas, below its replication factor of "
                    f"{len(replicas)}: only {len(others)} other brokers are registered"
                )
            chosen = min(candidates, key=lambda b: (load[b], b))
            load[chosen] += 1
            plan[name, partition] = tuple(chosen if b == leaving else b for b in replicas)
    return plan


def still_holding(
    topics: Mapping[str, TopicInfo], membership: Callable[[str], Claim | None], leaving: int
) -> list[str]:
    """The groups whose membership, as their leader has it, may still hold ``leaving``: those
    assigned to it, those whose leader is not known, and those whose committed membership
    holds it or whose latest is not committed yet. Sorted."""
    holding = []
    for name, info in topics.items():
        for partition, replicas in enumerate(info.replicas):
            log_id = f"{name}/{partition}"
            claim = membership(log_id)
            if (
                leaving in replicas
                or claim is None
                or not claim.committed
                or leaving in claim.voters | claim.learners
            ):
                holding.append(log_id)
    return sorted(holding)


async def serve_hand_over(metadata: ClusterMetadata, seconds: float) -> ControllerHandOver:
    """Answer a peer's ``HandOverControllerRequest``: if this replica leads the controller
    quorum, hand the leadership to another controller within ``seconds`` (capped at
    ``_HAND_OVER_MAX_S``), as a graceful shutdown does. Never raises."""
    deadline = trio.current_time() + min(seconds, _HAND_OVER_MAX_S)
    handed_over = await metadata.hand_over_leadership(deadline)
    return ControllerHandOver(handed_over, metadata.view.controller_leader)


async def hand_controller_over(
    metadata: ClusterMetadata,
    forwarder: Forwarder,
    leaving: int,
    *,
    seconds: float = HAND_OVER_TIMEOUT_S,
) -> None:
    """Have broker ``leaving``, which leads the controller quorum as this replica sees it, hand
    that leadership to another controller; return once this replica's view names another
    leader.

    Bounded: ``seconds`` for the hand-over, plus ``_HAND_OVER_SLACK_S`` for the round trip and
    the news. Raises ``RequestError`` ``TIMEOUT`` (retriable: nothing was removed, and the
    leaving broker leads or an election is on) saying why: ``leaving`` did not answer, no other
    controller could take the lead in time, or this replica has not heard of the new leader.
    """
    deadline = trio.current_time() + seconds + _HAND_OVER_SLACK_S
    why = f"broker {leaving} holds no replica any more, but it leads the controller quorum"
    again = f"send REMOVEBROKER {leaving} again"
    try:
        answer = await forwarder.call(
            leaving, HandOverControllerRequest(seconds), deadline=deadline
        )
    except ForwardError as exc:
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{why} and did not answer the request to hand it over ({exc}); {again}",
        ) from exc
    if not isinstance(answer, ControllerHandOver):
        raise RequestError(
            ErrorCode.INTERNAL, f"broker {leaving} answered a hand-over with {answer!r:.200}"
        )
    if answer.handed_over is False:
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{why} and could not hand it over within {seconds:.0f} s: no other controller was "
            f"connected and up to date with its log; {again} once they have caught up",
        )
    with trio.move_on_at(deadline):
        while metadata.view.controller_leader in (None, leaving):
            await trio.sleep(_POLL_S)
    leader = metadata.view.controller_leader
    if leader is None or leader == leaving:
        seen = "no controller leader" if leader is None else f"broker {leaving} still leading"
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{why}; asked to hand it over, it answered {answer.handed_over} (leader "
            f"{answer.leader}), but this broker's replica sees {seen}; {again}",
        )
    log.info("broker %d handed the controller quorum's leadership to broker %d", leaving, leader)


async def decommission(
    metadata: ClusterMetadata,
    membership: Callable[[str], Claim | None],
    forwarder: Forwarder,
    self_id: int,
    leaving: int,
    *,
    timeout: float = DECOMMISSION_TIMEOUT_S,
) -> int:
    """Move every replica off ``leaving``, then remove it from the registry and the controller
    quorum. Returns how many partitions were reassigned by this call.

    If ``leaving`` leads the controller quorum once its replicas are gone, it is asked first
    (through ``forwarder``) to hand that leadership over (``hand_controller_over``).

    Raises ``RequestError``: ``INVALID_CONFIG`` if ``leaving`` is not registered, is the broker
    running this, or its removal would leave a partition below its replication factor (nothing
    changed then); ``TIMEOUT`` if the replicas have not moved within ``timeout`` (they go on
    moving: sending the command again finishes the job), or if ``leaving`` leads the controller
    quorum and did not hand that over in time (see ``hand_controller_over``; sent again, the
    command goes on from there). Metadata errors are the caller's to translate
    (``MetadataError``).
    """
    if leaving == self_id:
        raise RequestError(
            ErrorCode.INVALID_CONFIG,
            f"broker {leaving} cannot decommission itself: send REMOVEBROKER to another broker",
        )
    view = metadata.view
    info = view.brokers.get(leaving)
    if info is None:
        raise RequestError(ErrorCode.INVALID_CONFIG, f"no broker {leaving} is registered")
    try:
        plan = plan_removal(view.brokers, view.topics, leaving)
    except ValueError as exc:
        raise RequestError(ErrorCode.INVALID_CONFIG, str(exc)) from exc
    log.info(
        "broker %d: decommissioning broker %d: %d partitions move", self_id, leaving, len(plan)
    )
    limiter = trio.CapacityLimiter(_CONCURRENT_METADATA_CALLS)

    async def reassign(topic: str, partition: int, replicas: tuple[int, ...]) -> None:
        async with limiter:
            await metadata.set_replicas(topic, partition, replicas)

    async with trio.open_nursery() as nursery:
        for (topic, partition), replicas in plan.items():
            nursery.start_soon(reassign, topic, partition, replicas)
    with trio.move_on_after(timeout):
        while holding := still_holding(metadata.view.topics, membership, leaving):
            await trio.sleep(_POLL_S)
    if holding:
        shown = ", ".join(holding[:5]) + (", ..." if len(holding) > 5 else "")
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{len(holding)} partitions still hold broker {leaving} after {timeout:.0f} s "
            f"({shown}); they go on moving: send REMOVEBROKER {leaving} again to finish",
        )
    # The quorum first, the registry last: a command sent again finds the broker registered
    # (and its controller's address there) until everything else is done.
    if metadata.view.controller_leader == leaving:
        await hand_controller_over(metadata, forwarder, leaving)
    await metadata.remove_controller(leaving)
    await metadata.remove_broker(leaving)
    log.info("broker %d: broker %d is decommissioned", self_id, leaving)
    return len(plan)


async def delegate_decommission(
    metadata: ClusterMetadata,
    forwarder: Forwarder,
    self_id: int,
    connected: Collection[int],
    *,
    timeout: float = DECOMMISSION_TIMEOUT_S,
) -> int:
    """``REMOVEBROKER`` of this broker itself, sent to it: have another broker carry it out
    (``DecommissionRequest``; it asks this one to hand the controller lead over if need be).
    The receiver is the controller leader's broker if it is ``connected``, else the connected
    registered broker of lowest id. Returns how many partitions it reassigned.

    Raises ``RequestError``: what the other broker refused with (``INVALID_CONFIG``...);
    ``INVALID_CONFIG`` if no other broker is registered; ``NO_QUORUM`` (nothing done, retry) if
    none is connected; ``TIMEOUT`` if the one asked did not answer within ``timeout`` and
    slack (it may go on: sending the command again finishes the job).
    """
    view = metadata.view
    if self_id not in view.brokers:
        raise RequestError(ErrorCode.INVALID_CONFIG, f"no broker {self_id} is registered")
    registered = sorted(b for b in view.brokers if b != self_id)
    if not registered:
        raise RequestError(
            ErrorCode.INVALID_CONFIG,
            f"broker {self_id} is the only registered broker: there is nowhere to move its "
            "replicas, and nobody to remove it",
        )
    candidates = [b for b in registered if b in connected]
    leader = view.controller_leader
    if leader is not None and leader in candidates:  # it changes the quorum with no more hop
        candidates.remove(leader)
        candidates.insert(0, leader)
    deadline = trio.current_time() + timeout + HAND_OVER_TIMEOUT_S + _DELEGATE_SLACK_S
    for broker in candidates:
        try:
            answer = await forwarder.call(broker, DecommissionRequest(self_id), deadline=deadline)
        except PeerUnavailable:
            continue  # never sent: the next one
        except ForwardError as exc:
            raise RequestError(
                ErrorCode.TIMEOUT,
                f"broker {broker}, asked to carry out REMOVEBROKER {self_id} (a broker cannot "
                f"remove itself), did not answer ({exc}); send REMOVEBROKER {self_id} again",
            ) from exc
        match answer:
            case Decommissioned(moved):
                return moved
            case Refused(code, message):
                raise RequestError(code, message)
        raise RequestError(
            ErrorCode.INTERNAL, f"broker {broker} answered a decommission with {answer!r:.200}"
        )
    raise RequestError(
        ErrorCode.NO_QUORUM,
        f"REMOVEBROKER {self_id} must be carried out by another broker (a broker cannot remove "
        f"itself), and none of {', '.join(map(str, registered))} is connected; retry",
    )
