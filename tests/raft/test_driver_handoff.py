"""A follower's round of one pass (issue 22): its acknowledgement leaves from the fsync worker.

Three drivers over real loopback transports, wired as a broker wires them (``post``, ``flush``,
``hand_off``). Sequential proposals commit; the followers' acknowledgements were written by the
worker once durable (never before: ``_durable_then_send``), and their rounds are finished by the
next frame or the tick, not by a wake-up of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from kafkaesque.cli.cluster import free_ports

from kafkaesque.raft import Role
from kafkaesque.raft._driver import MultiRaft, _durable_then_send
from kafkaesque.raft._transport import Handoff, PeerTransport
from kafkaesque.storage import Record, build_batch

GROUP = "t/0"


class Broker:
    def __init__(self, node_id: int, root: Path, peers: dict[int, tuple[str, int]]) -> None:
        self.id = node_id
        self.port = peers[node_id][1]
        self.raft = MultiRaft(
            node_id,
            self._post,
            flush=self._flush,
            hand_off=self._hand_off,
            state_dir=str(root / f"b{node_id}"),
            peers=peers,
        )
        self.transport = PeerTransport(
            node_id,
            peers,
            cluster="t",
            secret=b"s",
            on_items=self.raft.handle_items,
            on_peer_change=self.raft.peer_changed,
        )
        self.raft.add_group(GROUP, str(root / f"b{node_id}" / "t-0"), peers)

    def _post(self, peer: int, item: Any) -> bool:
        return self.transport.post(peer, item)

    def _flush(self) -> None:
        self.transport.flush()

    def _hand_off(self, peer: int, items: list[Any]) -> Handoff | None:
        return self.transport.hand_off(peer, items)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.run, "127.0.0.1", self.port)
            await nursery.start(self.raft.run)


async def test_sequential_writes_commit_with_the_followers_acknowledging_from_the_worker(
    tmp_path: Path,
) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        with trio.fail_after(10):
            while True:
                leaders = [b for b in brokers if b.raft.groups[GROUP].role is Role.LEADER]
                if leaders:
                    break
                await trio.sleep(0.02)
        leader = leaders[0]
        followers = [b for b in brokers if b is not leader]
        before = [f.raft.handoffs for f in followers]
        with trio.fail_after(30):
            for i in range(50):
                await leader.raft.propose(GROUP, build_batch([Record(value=b"v%d" % i)]), 1)
        # Every write's acknowledgement came from the followers' workers, most of them at least
        # (a round whose peer connection was busy posts instead), and the followers' rounds
        # were all finished: by the next frame, or the tick.
        assert all(f.raft.handoffs - b >= 40 for f, b in zip(followers, before, strict=True))
        end = leader.raft.groups[GROUP].commit_index
        with trio.fail_after(5):
            while any(f.raft.groups[GROUP].commit_index < end for f in followers):
                await trio.sleep(0.02)
        for f in followers:
            assert f.raft._round is None or f.raft._round.handoffs
            values = [r.value for r in f.raft.groups[GROUP].committed_records()]
            assert values[-50:] == [b"v%d" % i for i in range(50)]
        nursery.cancel_scope.cancel()


class _Recording:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send(self) -> bool:
        self.log.append("send")
        return True


def test_the_worker_writes_the_acknowledgements_only_after_the_round_is_durable() -> None:
    log: list[str] = []

    def durable() -> None:
        log.append("fsync")

    def failing() -> None:
        raise OSError("EIO")

    handoffs: Any = [_Recording(log), _Recording(log)]
    assert _durable_then_send(durable, handoffs) is True
    assert log == ["fsync", "send", "send"]
    log.clear()
    with pytest.raises(OSError):
        _durable_then_send(failing, handoffs)
    assert log == []  # a failed fsync acknowledges nothing (and stops the driver)
