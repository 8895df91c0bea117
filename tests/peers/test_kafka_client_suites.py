"""Kafka clients' own integration suites, run against a real 3-broker cluster of ours.

A Go module is its project's source release, tests included, served by the Go module proxy; so
two clients' own integration tests are fetched at their pinned versions by ``bin/fetch-peers``
(its ``_go_test_suite``: the module copied writable into ``peers/go-suites/build/``, compiled with
``go test -c``; nothing fetched is committed) and run here, not copied into this repository:

- **franz-go** v1.22.3, package ``pkg/kgo``: its broker tests read the seed brokers from
  ``KGO_SEEDS`` (``helpers_test.go``) and skip by themselves what the cluster does not list in
  ApiVersions (KIP-848, share groups); its unit tests run too (they need no broker).
- **confluent-kafka-go** v2.11.1 (librdkafka 2.11.1, linked statically from the module), package
  ``kafka``: ``TestIntegration``'s testify suite reads its brokers from ``testconf.json`` in the
  working directory (``testhelpers_test.go``), written here.

Every selected Go test must pass; the pytest test fails naming each Go test that failed, with the
end of its output. What we skip is the short list below, each with the reason; a patch, when one
is needed (``peers/go-suites/<suite>.patch``), is applied by ``bin/fetch-peers`` and says why.
docs/kafka.md ("Clients tested") lists what ran and what was skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kafkaesque.local_cluster import DevSecurity, LocalCluster, SecureCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "peers", "go-suites", "build")
FETCH_PEERS = os.path.join(ROOT, "bin", "fetch-peers")

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(shutil.which("go") is None, reason="Go is not installed"),
]

# Reasons shared by several skips.
_TRANSACTIONS = "transactions are not served (docs/kafka.md, Not yet)"
_FIRST_OFFSET_ONE = (
    "a new partition's first record is at offset 1, its first Raft leader's no-op at 0 "
    "(docs/kafka.md); the test reads from offset 0 or expects records there"
)

_MAX_MESSAGE_BYTES = (
    "its topic is created with max.message.bytes, a topic config we do not serve (CreateTopics "
    "answers INVALID_CONFIG for it: docs/kafka.md, Not yet)"
)


@dataclass(frozen=True)
class GoSuite:
    """One client's Go test package, built by ``bin/fetch-peers`` into ``BUILD/<name>/``."""

    name: str
    module: str
    package: str  # inside the module; its directory is the tests' working directory
    run: str  # -test.run: what we serve
    skips: dict[str, str]  # -test.skip pattern (slash-separated, as -run's) -> why
    env: Callable[[LocalCluster], dict[str, str]]
    write_files: Callable[[LocalCluster], dict[str, str]] = field(default=lambda _c: {})
    scram_env: Callable[[SecureCluster], dict[str, str]] = field(default=lambda _c: {})
    # Tests that must have run and passed, not skipped themselves (their environment is ours).
    must_pass: tuple[str, ...] = ()
    timeout_s: int = 420  # go test's own -timeout; the subprocess gets a minute more

    @property
    def binary(self) -> str:
        return os.path.join(BUILD, self.name, f"{self.name}.test")

    @property
    def workdir(self) -> str:
        return os.path.join(BUILD, self.name, "src", self.package)


def _franz_env(cluster: LocalCluster) -> dict[str, str]:
    return {
        "KGO_SEEDS": cluster.kafka_bootstrap,
        "KGO_TEST_RF": "3",
        # TestGroupETL's producer writes this many records (500,000 by default) for its chain of
        # group consumers: enough for every balancer's rebalances, bounded in time.
        "KGO_TEST_RECORDS": "5000",
        "KGO_LOG_LEVEL": "none",
    }


def _franz_scram_env(secure: SecureCluster) -> dict[str, str]:
    """TestSCRAMAuth and TestSCRAMAuthBadCredentials: a broker that requires SCRAM-SHA-256
    (on its plaintext Kafka port), and its user."""
    s = secure.security
    return {
        "KGO_TEST_SCRAM_SEEDS": secure.kafka_bootstrap,
        "KGO_TEST_SCRAM": f"{s.username}:{s.password}",
    }


def _confluent_conf(cluster: LocalCluster) -> dict[str, str]:
    conf = {
        "Brokers": cluster.kafka_bootstrap,
        "TopicName": "ckg-test",
        "GroupID": "ckg-testgroup",
        # The perf-style tests produce and consume this many messages (2,000,000 by default).
        "PerfMsgCount": 2000,
        "PerfMsgSize": 100,
        "Config": [],
    }
    return {"testconf.json": json.dumps(conf)}


FRANZ = GoSuite(
    name="franz-go",
    module="github.com/twmb/franz-go@v1.22.3",
    package="pkg/kgo",
    run=".",
    skips={
        "TestTxnEtl": _TRANSACTIONS,
        "TestAddRemovePartitions": _FIRST_OFFSET_ONE,
        "TestConsumeMaxDecompressBatchBytes": _FIRST_OFFSET_ONE,
        "TestIssueFetchLargerThanBrokerMaxReadBytes": _MAX_MESSAGE_BYTES,
        "TestClient_ProduceLargeMessages": _MAX_MESSAGE_BYTES,
    },
    env=_franz_env,
    scram_env=_franz_scram_env,
    must_pass=(
        "TestGroupETL",
        "TestClient_Produce",
        "TestSCRAMAuth",
        "TestSCRAMAuthBadCredentials",
    ),
)

CONFLUENT = GoSuite(
    name="confluent-kafka-go",
    module="github.com/confluentinc/confluent-kafka-go/v2@v2.11.1",
    package="kafka",
    run="^TestIntegration$",
    # TestIntegration's testify suite runs each of its methods as a subtest.
    skips={
        "TestIntegration/TestAdminClient_DeleteRecords": "DeleteRecords (21) is not served",
        "TestIntegration/TestAdminClient_DescribeTopics": (
            "topic ids (Metadata v10+) are not served, and it needs a SASL broker with KIP-430's "
            "authorized operations"
        ),
        "TestIntegration/TestAdminClient_UserScramCredentials": (
            "DescribeUserScramCredentials and AlterUserScramCredentials are not served "
            "(docs/kafka.md, Not yet: kafkaesque user add|remove)"
        ),
        "TestIntegration/TestAdminConfig": (
            "its topic is created with compression.type, a topic config we do not serve "
            "(INVALID_CONFIG), and it alters broker configs over AlterConfigs (33), not served"
        ),
        "TestIntegration/TestAdminTopics": (
            "it creates topics with explicit replica assignments, refused "
            "(INVALID_REPLICA_ASSIGNMENT: the cluster assigns replicas, docs/kafka.md)"
        ),
        "TestIntegration/TestAdminClient_ListOffsets": _FIRST_OFFSET_ONE,
        "TestIntegration/TestConsumerOffsetsForTimes": _FIRST_OFFSET_ONE,
        "TestIntegration/TestConsumerSeekPartitions": (
            "it seeks with leader epoch 0, Kafka's first epoch; ours is the Raft term, from 1 "
            "(docs/kafka.md), so librdkafka's OffsetForLeaderEpoch check sees a truncation and "
            "resets; and the first record is at offset 1"
        ),
    },
    env=lambda _c: {},
    write_files=_confluent_conf,
    must_pass=(
        "TestIntegration/TestAdminACLs",
        "TestIntegration/TestConsumerPollRebalanceIncremental",
        "TestIntegration/TestAdminClient_ListConsumerGroups",
    ),
)


def skip_pattern(skips: dict[str, str]) -> str:
    """One -test.skip regexp for every entry: Go matches a slash-separated pattern level by
    level, so entries are grouped by their parent path (``A/B`` and ``A/C`` as ``^A$/^(B|C)$``)."""
    by_parent: dict[str, list[str]] = {}
    for name in skips:
        parent, _, leaf = name.rpartition("/")
        by_parent.setdefault(parent, []).append(leaf)
    if len(by_parent) > 1:
        raise ValueError("the skips of one suite must share one parent path")
    ((parent, leaves),) = by_parent.items()
    leaf = "^(" + "|".join(sorted(leaves)) + ")$"
    if not parent:
        return leaf
    return "/".join(f"^{p}$" for p in parent.split("/")) + "/" + leaf


@dataclass
class GoTestRun:
    """What ``go tool test2json`` said of one run: each test's last action and its output."""

    actions: dict[str, str]  # test name (A/B for a subtest) -> pass, fail or skip
    output: dict[str, list[str]]  # test name ("" for the package) -> its lines
    package_action: str | None  # pass or fail for the whole binary; None if it never ended

    @property
    def failed(self) -> list[str]:
        return sorted(t for t, a in self.actions.items() if a == "fail")

    def count(self, action: str) -> int:
        return sum(1 for a in self.actions.values() if a == action)

    def explain(self, tail: int = 25) -> str:
        parts = []
        for test in self.failed or [""]:
            lines = self.output.get(test, [])[-tail:]
            parts.append(f"--- {test or '(package)'}:\n" + "".join(lines))
        return "\n".join(parts)


def parse_test2json(text: str) -> GoTestRun:
    """The events of ``go tool test2json`` (one JSON object a line; other lines ignored)."""
    run = GoTestRun({}, {}, None)
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        test = event.get("Test", "")
        action = event.get("Action")
        if action == "output":
            run.output.setdefault(test, []).append(event.get("Output", ""))
        elif action in ("pass", "fail", "skip"):
            if test:
                run.actions[test] = action
            else:
                run.package_action = action
    return run


def run_suite(
    suite: GoSuite, cluster: LocalCluster, secure: SecureCluster, scratch: str
) -> GoTestRun:
    """Run the suite's test binary against ``cluster`` (and ``secure`` for its SASL tests),
    bounded by ``suite.timeout_s``."""
    if not os.path.isfile(suite.binary):
        pytest.skip(f"{suite.module}'s tests are not built: run {FETCH_PEERS}")
    for name, text in suite.write_files(cluster).items():
        with open(os.path.join(suite.workdir, name), "w", encoding="utf-8") as f:
            f.write(text)
    args = ["-test.v=test2json", "-test.count=1", f"-test.timeout={suite.timeout_s}s"]
    args.append(f"-test.run={suite.run}")
    if suite.skips:
        args.append(f"-test.skip={skip_pattern(suite.skips)}")
    env = {**os.environ, **suite.env(cluster), **suite.scram_env(secure), "TMPDIR": scratch}
    done = subprocess.run(
        ["go", "tool", "test2json", "-t", "-p", suite.name, suite.binary, *args],
        cwd=suite.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=suite.timeout_s + 60,
        check=False,
    )
    run = parse_test2json(done.stdout)
    if run.package_action is None:  # the binary died before it said so (a panic, a timeout)
        run.package_action = "fail"
        run.output.setdefault("", []).append(done.stderr[-4000:])
    return run


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-client-suites"))
    # confluent-kafka-go's own test cluster (its testresources/docker-compose.yaml) makes
    # User:ANONYMOUS a super user: its TestAdminACLs creates ACLs, and once any exists every
    # other test's requests are checked against them.
    extra = ["--group-initial-rebalance-delay", "0.3", "--super-users", "User:ANONYMOUS"]
    with LocalCluster(directory, 3, extra_args=extra) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    """One broker that requires SCRAM (a users file), for the suites' SASL tests."""
    directory = str(tmp_path_factory.mktemp("kafka-client-suites-scram"))
    with SecureCluster(directory, 1, security=DevSecurity.make(directory)) as c:
        c.wait_ready()
        yield c


@pytest.mark.parametrize("suite", [FRANZ, CONFLUENT], ids=lambda s: s.name)
def test_client_integration_suite_passes_against_our_cluster(
    suite: GoSuite, cluster: LocalCluster, secure: SecureCluster, tmp_path: Path
) -> None:
    run = run_suite(suite, cluster, secure, str(tmp_path))
    assert run.package_action == "pass" and not run.failed, (
        f"{suite.module}: {len(run.failed)} Go tests failed: {run.failed}\n{run.explain()}"
    )
    # Something ran: a suite that skipped itself whole (no brokers found) would pass empty.
    assert run.count("pass") >= 10, run.actions
    assert {t: run.actions.get(t) for t in suite.must_pass} == dict.fromkeys(
        suite.must_pass, "pass"
    )
