"""What the brokers tell each other for the console (``PeerViews``, pure) and the overview's
who-hears-whom matrix built from it by the shared snapshot (``ClusterSnapshots``)."""

from __future__ import annotations

import trio
import trio.testing

from kafkaesque.broker._peer_views import ElectionNote, PeerViews
from kafkaesque.broker.http import Timeline
from kafkaesque.broker.http._snapshot import ClusterSnapshots, SnapshotProbes

from .test_console import World


def test_a_view_says_whom_its_broker_hears_until_it_is_stale_or_its_broker_is_gone() -> None:
    views = PeerViews(stale_s=5.0)
    assert views.heard_by(1, now=0.0) is None  # never told
    views.report(1, (0, 2), {}, now=10.0)
    assert views.heard_by(1, now=14.0) == frozenset({0, 2})
    assert views.heard_by(1, now=15.5) is None  # a paused broker tells nothing: unknown
    views.report(1, (0,), {}, now=16.0)
    assert views.heard_by(1, now=16.0) == frozenset({0})
    views.forget(1)  # its connection closed
    assert views.heard_by(1, now=16.0) is None


def test_the_election_of_the_highest_term_is_kept_per_group() -> None:
    views = PeerViews()
    views.report(1, (), {"t/0": (3, "leader gone", 1_000)}, now=0.0)
    views.report(2, (), {"t/0": (2, "start-up", 500)}, now=0.0)  # late news of an older term
    assert views.election("t/0") == ElectionNote(1, 3, "leader gone", 1_000)
    views.note("t/0", ElectionNote(0, 4, "leadership transfer", 2_000))
    assert views.election("t/0") == ElectionNote(0, 4, "leadership transfer", 2_000)
    assert views.election("t/1") is None


def test_the_overview_has_a_row_per_broker_of_whom_it_hears() -> None:
    """Broker 0's row is its own pings; broker 1's its last view; broker 2, not heard by 0, is
    unknown (its old view is not believed)."""
    world = World()
    views = PeerViews()
    views.report(1, (0,), {}, now=0.0)  # broker 1 does not hear broker 2
    views.report(2, (0, 1), {}, now=0.0)
    world.heard[2] = False
    base = world.probes()
    probes = SnapshotProbes(
        broker_id=base.broker_id,
        view=base.view,
        hears=base.hears,
        leader_of=base.leader_of,
        replicas=base.replicas,
        ends=base.ends,
        heard_by=lambda peer: views.heard_by(peer, now=0.0),
        election=views.election,
    )

    async def main() -> None:
        snapshots = ClusterSnapshots(probes, Timeline(), clock=trio.current_time)
        overview = (await snapshots.current()).overview()
        rows = {b["id"]: b["hears"] for b in overview["brokers"]}
        assert rows == {
            0: {"1": True, "2": False},
            1: {"0": True, "2": False},
            2: {"0": None, "1": None},
        }

    trio.run(main, clock=trio.testing.MockClock())


def test_the_peers_group_offsets_are_kept_until_their_view_is_stale_or_their_broker_gone() -> None:
    views = PeerViews(stale_s=5.0)
    views.report(1, (0,), {}, now=10.0, offsets=(("billing", "t", 0, 4),))
    views.report(2, (0,), {}, now=10.0, offsets=(("audit", "t", 1, 2), ("audit", "u", 0, 9)))
    assert sorted(views.group_offsets(now=12.0)) == [
        ("audit", "t", 1, 2),
        ("audit", "u", 0, 9),
        ("billing", "t", 0, 4),
    ]
    views.report(1, (0,), {}, now=14.0)  # broker 1 coordinates nothing any more
    views.forget(2)
    assert views.group_offsets(now=14.0) == []
    views.report(2, (0,), {}, now=14.0, offsets=(("audit", "t", 1, 3),))
    assert views.group_offsets(now=20.0) == []  # stale
