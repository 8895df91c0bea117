"""``JepsenCluster``'s operator procedures, on a scripted cluster (no processes): what
``remove_broker`` sends and does for each answer ``REMOVEBROKER`` may give, and when
``wait_in_sync`` lets a rolling restart go on.

The real runs (test_operator_nemeses.py) show them working against brokers; these pin the
answers that a healthy run rarely gives (``BUSY``, ``TIMEOUT``, a refusal, a broker that lags).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from kafkaesque.jepsen_like._cluster import ClusterFault, JepsenCluster, NodeAddress, Placement

from kafkaesque.client import (
    AsyncClient,
    ConnectionCore,
    KafkaesqueConnectionError,
    KafkaesqueError,
)
from kafkaesque.protocol import RemoteProtocolError, encode_command

Sample = tuple[str, dict[str, str], float]


class _Scripted(JepsenCluster):  # type: ignore[misc]  # untyped by its installed name
    """Members 0-2 (and spare 3) that answer from a script instead of processes."""

    def __init__(self, removebroker: list[str]) -> None:
        placement = Placement(
            nodes={i: NodeAddress("127.0.0.1", 1, 2, 3, 4) for i in range(4)},
        )
        super().__init__(placement, "/nonexistent", "/nonexistent", members=[0, 1, 2])
        self.up = {0, 1, 2}
        self.removebroker = removebroker  # answers to REMOVEBROKER, in turn
        self.sent: list[tuple[int, str]] = []
        self.terminated: list[int] = []
        self.registered = {0, 1, 2}
        self.replicas = {0, 1, 2}
        self.stale_answers = 0  # METADATA answers after +OK that still show the removed broker
        self.metrics: dict[int, list[list[Sample]]] = {}  # node -> successive scrapes

    def running(self, node: int) -> bool:
        return node in self.up

    async def ask(self, node: int, question: Any, timeout: float = 3.0) -> Any:
        return await question(_ScriptedBroker(self, node))

    def answer(self, node: int, line: str) -> list[str]:
        """The reply lines of ``node`` to the command ``line``."""
        self.sent.append((node, line))
        if line.startswith("REMOVEBROKER "):
            reply = self.removebroker.pop(0)
            if reply.startswith("+OK"):
                self.registered.discard(int(line.split()[1]))
            return [reply]
        if line == "METADATA":
            rows = [f"+BROKER {b} 127.0.0.1 1" for b in sorted(self.registered)]
            rows.append("+PARTITION t 0 leader=0 replicas=" + ",".join(map(str, self.replicas)))
            if self.stale_answers > 0:
                self.stale_answers -= 1
            else:
                self.replicas &= self.registered
            return [*rows, "+END"]
        raise AssertionError(f"unexpected {line!r}")

    async def terminate(self, node: int, timeout: float = 30.0) -> int | None:
        self.terminated.append(node)
        self.up.discard(node)
        return 0

    async def scrape(self, node: int) -> list[Sample]:
        queue = self.metrics[node]
        return queue.pop(0) if len(queue) > 1 else queue[0]


class _ScriptedBroker(AsyncClient):
    """A client of broker ``node`` whose answers come from the script: the client's own calls
    and parsing, the script's reply lines instead of a socket."""

    def __init__(self, cluster: _Scripted, node: int) -> None:
        super().__init__(config=cluster.client_config(3.0))
        self.cluster, self.node = cluster, node

    async def run(self, operation: Any) -> Any:
        outcome: Any = None
        failure: KafkaesqueError | None = None
        while True:
            try:
                step = operation.send(outcome) if failure is None else operation.throw(failure)
            except StopIteration as stop:
                return stop.value
            outcome, failure = None, None
            command = getattr(step, "command", None)
            if command is None:
                continue  # a pause between attempts: none with one attempt
            line = encode_command(command).decode().removesuffix("\r\n")
            core: ConnectionCore[int] = ConnectionCore()
            core.send(command, 0)
            try:
                reply = "".join(f"{r}\r\n" for r in self.cluster.answer(self.node, line))
                outcome = dict(core.receive_data(reply.encode()))[0]
            except RemoteProtocolError as exc:
                failure = KafkaesqueConnectionError(
                    f"n{self.node} broke the protocol: {exc}", sent=True, retriable=False
                )


def _partition(name: str, value: float, **labels: str) -> Sample:
    return (f"kafkaesque_partition_{name}", {"topic": "t", "partition": "0", **labels}, value)


def _leader_at(end: float) -> list[Sample]:
    return [
        _partition("is_leader", 1),
        _partition("term", 2),
        _partition("log_end_offset", end),
        _partition("follower_lag", 0, follower="2"),
    ]


async def test_a_removal_is_sent_to_another_member_then_the_broker_is_stopped_and_retired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted(["+OK moved=3"])
    cluster.stale_answers = 5  # a member still places a replica on it for a while
    assert await cluster.remove_broker(0) == "+OK moved=3"
    assert cluster.sent[0] == (1, "REMOVEBROKER 0"), "never to the leaving broker itself"
    # Stopped only once no member's METADATA registers it or gives it a replica any more.
    metadata = [line for _, line in cluster.sent if line == "METADATA"]
    assert len(metadata) > 5
    assert cluster.terminated == [0]
    assert cluster.members == [1, 2] and cluster.retired == [0]
    assert cluster.bootstrap == ["127.0.0.1:1", "127.0.0.1:1"]


async def test_timeout_is_sent_again_and_busy_stops_the_broker_before_sending_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted(
        [
            "-ERR TIMEOUT 4 partitions still hold broker 1 after 300 s",
            # What brokers said before REMOVEBROKER handed the controller lead over itself.
            "-ERR BUSY broker 1 holds no replica any more, but it leads the controller quorum, "
            "which cannot remove its own leader: stop it (kafkaesque broker stop hands the lead "
            "over) and send REMOVEBROKER 1 again",
            "+OK moved=0",
        ]
    )
    assert await cluster.remove_broker(1) == "+OK moved=0"
    removals = [line for _, line in cluster.sent if line.startswith("REMOVEBROKER")]
    assert removals == ["REMOVEBROKER 1"] * 3
    # Stopped gracefully (as BUSY's message says) before the third; a stopped one again at the end.
    assert cluster.terminated == [1, 1]
    assert cluster.members == [0, 2] and cluster.retired == [1]


async def test_other_retriable_errors_are_sent_again_without_stopping_the_broker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted(
        [
            "-ERR NO_QUORUM the metadata quorum has no leader; retry",
            "-ERR BUSY too many requests in flight",  # load shed: not the controller's leader
            "-ERR NOT_READY the broker is still loading the cluster's metadata; retry",
            "+OK moved=4",
        ]
    )
    assert await cluster.remove_broker(2) == "+OK moved=4"
    assert cluster.terminated == [2], "stopped once, after it left"
    assert cluster.members == [0, 1] and cluster.retired == [2]


async def test_a_refusal_leaves_the_broker_a_member(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted(["-ERR INVALID_CONFIG removing broker 2 would leave t/0 with 2 replicas"])
    with pytest.raises(ClusterFault, match="INVALID_CONFIG"):
        await cluster.remove_broker(2)
    assert cluster.terminated == [] and cluster.members == [0, 1, 2] and cluster.retired == []
    garbled = _Scripted(["-ERR"])
    with pytest.raises(ClusterFault, match=r"REMOVEBROKER 2 answered .*'-ERR'"):
        await garbled.remove_broker(2)


async def test_a_removal_that_never_completes_gives_up_after_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted(["-ERR TIMEOUT still moving"] * 1000)
    with pytest.raises(ClusterFault, match="not done in 30 s"):
        await cluster.remove_broker(2, timeout=30.0)
    assert cluster.members == [0, 1, 2]


async def test_wait_in_sync_waits_until_the_restarted_broker_reaches_the_leaders_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = _Scripted([])
    behind = [_partition("log_end_offset", 10)]
    caught_up = [_partition("log_end_offset", 100)]
    cluster.metrics = {
        0: [_leader_at(100), _leader_at(150)],  # the target is the end first seen: 100
        1: [[]],
        2: [behind, behind, behind, caught_up],
    }
    t0 = trio.current_time()
    await cluster.wait_in_sync(2, timeout=60.0)
    assert cluster.metrics[2] == [caught_up], "returned before the broker caught up"
    assert trio.current_time() - t0 < 60.0

    cluster.metrics = {0: [_leader_at(100)], 1: [[]], 2: [behind]}
    with pytest.raises(ClusterFault, match="t/0 on broker 2 is at 10 of 100"):
        await cluster.wait_in_sync(2, timeout=5.0)
