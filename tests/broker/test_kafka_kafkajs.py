"""kafkajs (Node.js; its own protocol code, pinned in tests/kafkajs/package.json and installed
by bin/_bootstrap.sh from the npm registry) on a real 3-broker cluster: tests/kafkajs/matrix.js
creates topics with its admin, produces idempotently with acks=all (headers, null keys and
values, no codec and gzip: kafkajs builds in no other codec, snappy, lz4 and zstd need plug-in
packages), reads them back exactly, runs a group of two members with a rebalance in the middle,
commits, resumes with a third member, describes the group, seeks to the offset the admin finds
for a timestamp, and deletes a topic. The script prints one JSON object; this test judges it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.local_cluster import LocalCluster

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kafkajs")
SCRIPT = os.path.join(HERE, "matrix.js")

pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(
        not os.path.isdir(os.path.join(HERE, "node_modules", "kafkajs")),
        reason="kafkajs is not installed in tests/kafkajs/node_modules (bin/_bootstrap.sh does)",
    ),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-kafkajs"))
    with LocalCluster(directory, 3, extra_args=["--group-initial-rebalance-delay", "0.3"]) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def matrix(cluster: LocalCluster) -> dict[str, Any]:
    """What matrix.js saw (one run serves every test of this module)."""
    result = subprocess.run(
        ["node", SCRIPT, cluster.kafka_bootstrap, "kj"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=HERE,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr
    out: dict[str, Any] = json.loads(lines[-1])
    assert result.returncode == 0 and "error" not in out, out.get("error", result.stderr)
    return out


def test_kafkajs_admin_creates_lists_and_deletes_topics(matrix: dict[str, Any]) -> None:
    assert matrix["created"] is True
    assert matrix["listed"] == ["kj-doomed", "kj-group", "kj-records", "kj-times"]
    assert matrix["afterDelete"] == ["kj-group", "kj-records", "kj-times"]


def test_kafkajs_idempotent_producer_writes_headers_null_keys_and_values_with_gzip(
    matrix: dict[str, Any],
) -> None:
    assert [s["codec"] for s in matrix["sent"]] == ["none", "gzip"]
    assert all(a["errorCode"] == 0 for s in matrix["sent"] for a in s["acks"])
    assert matrix["read"] == matrix["expected"]  # in order, exactly
    assert {"key": None, "value": None, "headers": {}} in matrix["read"]


def test_kafkajs_group_of_two_rebalances_describes_commits_and_resumes(
    matrix: dict[str, Any],
) -> None:
    everything = {f"v{i}" for i in range(100)}
    assert set(matrix["groupValues"]) == everything
    first, *later = matrix["assignments"]
    assert first == {"name": "first", "partitions": [0, 1, 2, 3]}  # alone: every partition
    # After the second member's join, the last generation splits the topic between them.
    last = {a["name"]: a["partitions"] for a in later[-2:]}
    assert sorted(last) == ["first", "second"], matrix["assignments"]
    assert sorted(last["first"] + last["second"]) == [0, 1, 2, 3]
    assert len(last["first"]) == len(last["second"]) == 2
    [group] = matrix["described"]
    assert group["state"] == "Stable" and group["protocolType"] == "consumer"
    assert len(group["members"]) == 2
    # The third member reads exactly what came after both members' commits.
    assert sorted(matrix["resumed"]) == sorted(f"v{i}" for i in range(100, 120))


def test_kafkajs_seeks_to_the_offset_found_for_a_timestamp(matrix: dict[str, Any]) -> None:
    assert matrix["sought"] == [f"t{i}" for i in range(4, 10)]
    assert matrix["firstSoughtTimestamp"] == 4000
