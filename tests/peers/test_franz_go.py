"""franz-go (Go; a strict, modern client with its own protocol code, pinned in tests/franz/go.mod:
franz-go v1.22.3 and kadm v1.20.0, the modules fetched by ``bin/fetch-peers``) on a real 3-broker
cluster: tests/franz/main.go creates, lists and describes topics with kadm, produces
idempotently with acks=all (keys, headers) and reads the records back exactly, runs a consumer
group of two kgo clients through a rebalance with commits, describes the group and its lag, and
deletes a topic. The program prints one JSON object; this test judges it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.local_cluster import LocalCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "tests", "franz")
BINARY = os.path.join(HERE, "bin", "franz")  # gitignored; built here (or by bin/fetch-peers)

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed"),
]


def build() -> str:
    """The program, built from tests/franz (Go's build cache makes a second build a check)."""
    done = subprocess.run(
        ["go", "build", "-mod=readonly", "-o", BINARY, "."],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"go build failed (bin/fetch-peers fetches the modules):\n{done.stderr}")
    return BINARY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-franz"))
    with LocalCluster(directory, 3, extra_args=["--group-initial-rebalance-delay", "0.3"]) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def franz(cluster: LocalCluster) -> dict[str, Any]:
    """What the franz-go program saw (one run serves every test of this module)."""
    result = subprocess.run(
        [build(), cluster.kafka_bootstrap, "fz"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-3000:]
    out: dict[str, Any] = json.loads(lines[-1])
    assert result.returncode == 0 and "error" not in out, out.get("error", result.stderr[-3000:])
    return out


def test_franz_kadm_creates_lists_describes_and_deletes_topics(franz: dict[str, Any]) -> None:
    assert franz["listed"] == ["fz-doomed", "fz-group", "fz-records"]
    assert franz["described"] == {
        "fz-group": {"partitions": 4, "replicas": 12, "isr": 12, "leaders": 3},
        "fz-records": {"partitions": 3, "replicas": 9, "isr": 9, "leaders": 3},
    }
    assert franz["afterDelete"] == ["fz-group", "fz-records"]


def test_franz_idempotent_producer_reads_back_keys_headers_and_offsets_exactly(
    franz: dict[str, Any],
) -> None:
    expected = franz["expected"]
    assert len(expected) == 60
    assert {r["headers"]["origin"] for r in expected} == {"franz-go"}
    # Same key, same partition; each partition's offsets consecutive (from 1: docs/kafka.md,
    # a new leader's Raft no-op takes offset 0).
    by_key: dict[str, set[int]] = {}
    for r in expected:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(parts) == 1 for parts in by_key.values())
    assert {r["partition"] for r in expected} == {0, 1, 2}
    for p in range(3):
        offsets = [r["offset"] for r in expected if r["partition"] == p]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert franz["read"] == expected


def test_franz_group_of_two_rebalances_commits_and_reports_lag(franz: dict[str, Any]) -> None:
    assert franz["groupValues"] == sorted(f"v{i}" for i in range(100))
    first, *later = franz["assignments"]
    assert first == {"name": "first", "partitions": [0, 1, 2, 3]}  # alone: every partition
    # Cooperative-sticky (franz-go's default): the second member is given what the first gave up.
    assert any(a["name"] == "second" and a["partitions"] for a in later), franz["assignments"]
    assert franz["readBy"]["first"] > 0 and franz["readBy"]["second"] > 0
    group = franz["group"]
    assert group["state"] == "Stable" and group["protocolType"] == "consumer"
    assert group["protocol"] == "cooperative-sticky"
    owned = sorted(p for m in group["members"] for p in m["partitions"])
    assert owned == [0, 1, 2, 3] and len(group["members"]) == 2
    assert all(len(m["partitions"]) == 2 for m in group["members"])
    # Both members committed what they read; the twenty records after it are the lag.
    assert franz["lag"]["total"] == 20
    assert sum(franz["lag"]["partitions"].values()) == 20
