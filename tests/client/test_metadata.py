"""Bootstrap lists, metadata snapshots, and where requests go (``ClusterState``)."""

from __future__ import annotations

import pytest

from kafkaesque.client import (
    ClusterMetadata,
    ClusterState,
    ListResponse,
    TopicPartition,
    parse_bootstrap,
)
from kafkaesque.client import Pinned as PinnedRoute
from kafkaesque.protocol import BrokerRow, EndReply, PartitionRow


def test_bootstrap_lists() -> None:
    assert parse_bootstrap("a:1, b:2,,c") == [("a", 1), ("b", 2), ("c", 9092)]
    assert parse_bootstrap(["[::1]:9093", "[::1]"]) == [("::1", 9093), ("::1", 9092)]
    for bad in ("", "a:x", "a:0", ":9092", "a:70000"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def snapshot(*rows: BrokerRow | PartitionRow) -> ClusterMetadata:
    return ClusterMetadata.from_response(ListResponse(rows, EndReply()))


BROKERS = (BrokerRow(0, "h0", 1), BrokerRow(1, "h1", 2))


def test_snapshot_knows_partition_counts_and_leaders() -> None:
    md = snapshot(
        *BROKERS,
        PartitionRow("t", 1, None, (0, 1)),
        PartitionRow("t", 0, 1, (1, 0)),
        PartitionRow("u", 0, 7, (7,)),
    )
    assert md.partition_count("t") == 2 and md.partition_count("nope") is None
    assert md.leader("t", 0) == BROKERS[1]
    assert md.leader("t", 1) is None  # election
    assert md.leader("u", 0) is None  # a leader the snapshot has no address for
    assert md.leader("t", 5) is None


def test_merge_replaces_only_the_topics_asked_about() -> None:
    old = snapshot(*BROKERS, PartitionRow("t", 0, 0, (0,)), PartitionRow("gone", 0, 0, (0,)))
    new = snapshot(BROKERS[0], PartitionRow("t", 0, 1, (1,)))
    merged = old.merged(new, ["t", "gone"])
    assert merged.partition_count("gone") is None
    assert merged.partitions["t"][0].leader == 1
    assert set(merged.brokers) == {0}


def test_requests_go_to_leaders_and_avoid_failed_addresses() -> None:
    state = ClusterState([("boot", 9)])
    route = TopicPartition("t", 0)
    assert state.address_for(route) == ("boot", 9)  # nothing known yet: any broker
    state.update_metadata(snapshot(*BROKERS, PartitionRow("t", 0, 1, (1, 0))))
    assert state.address_for(route) == ("h1", 2)
    assert state.address_for(None) == ("h0", 1)
    state.connection_failed(("h1", 2))
    state.connection_failed(("h0", 1))
    assert state.address_for(route) == ("boot", 9)  # the leader failed: any other broker
    assert state.candidates() == [("boot", 9), ("h1", 2), ("h0", 1)]
    state.connection_ok(("h1", 2))
    assert state.address_for(route) == ("h1", 2)
    assert state.address_for(PinnedRoute(("x", 1))) == ("x", 1)
