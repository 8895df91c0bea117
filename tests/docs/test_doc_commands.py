"""Every command in the docs is run by a test (issue 9: doc examples that rot are worse than none).

The docs are README.md and docs/*.md. Their fenced code blocks are read as a reader reads them:

* a block tagged ``sh`` is a shell script, and each of its commands must match exactly one entry
  of ``REGISTRY`` below, which says how it is run (``How``): here, in doc order, against one
  cluster started for this module the way the README's tour starts it (the docs that start a
  cluster of their own "or any running cluster" get that one); here, as a long-running command
  that must print ``ready`` and stop cleanly; or by a named test elsewhere (this module checks
  that it exists). A command added to the docs without an entry fails here, naming its file and
  line, and so does an entry no doc has any more;
* a block starting with ``$ telnet`` is a transcript, replayed over a socket and compared with
  what the broker answers, line by line;
* every other block must say what it is (``text``, ``python``, ...): an untagged block is an
  error, since an untagged shell command would silently escape this test; ``python`` blocks
  must at least compile.

Documented ports and data directories are rewritten to the test's (see ``_rewrite.py``). The
whole module takes about a minute (half of it the Spark job of the tour); the benchmarks the
README lists are run by ``slow`` tests (a minute or two each).
"""

from __future__ import annotations

import ast
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pytest

from tests.docs._blocks import Block, Command, commands, read_blocks
from tests.docs._procs import (
    ROOT,
    Env,
    LongRunning,
    kill_marked,
    marked_processes,
    run_script,
)
from tests.docs._rewrite import Rewriter, free_port_block
from tests.docs._transcript import parse, replay
from tests.docs.test_security_doc import COMMANDS as SECURITY_DOC_COMMANDS
from tests.docs.test_security_doc import TEST as SECURITY_DOC_TEST
from tests.mosquitto import running_mosquitto

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

_READY_TIMEOUT_S = 180.0  # three brokers starting on two busy cores
_SCRIPT_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 60.0


class How(Enum):
    HERE = "run here, in its block's bash script, against the tour's cluster"
    TOUR_CLUSTER = "the tour's cluster: started once for this module, as the README starts it"
    UNTIL_READY = "run here until it prints `ready`, then stopped with SIGTERM"
    BACKGROUND = (
        "started here in its block, against the tour's cluster; once it prints `ready` the "
        "block goes on; stopped with SIGTERM after the block"
    )
    TEST = "run by the test named in `node`"
    CI = "what CI runs"


@dataclass(frozen=True)
class Entry:
    """How one documented command is run; ``command`` is its exact text (a regex if
    ``pattern``). ``expect``: text the output of the command's block must hold (a compiled
    regex: a match of it, for a table whose column widths depend on what else the cluster holds)."""

    command: str
    how: How
    node: str = ""
    expect: tuple[str | re.Pattern[str], ...] = ()
    pattern: bool = False
    while_up: str = ""  # UNTIL_READY: a doc whose transcript is replayed while it runs

    def matches(self, text: str) -> bool:
        if self.pattern:
            return re.fullmatch(self.command, text) is not None
        return self.command == text


def here(command: str, *expect: str | re.Pattern[str]) -> Entry:
    return Entry(command, How.HERE, expect=expect)


def by(node: str, command: str, *, pattern: bool = False) -> Entry:
    return Entry(command, How.TEST, node=node, pattern=pattern)


DEMO_TEST = "tests/cli/test_demo.py::test_demo_quick_runs_the_pipeline_end_to_end_and_loses_nothing"
# The same nodes (3) and nemeses (kill-leader, partition) for 45 s instead of 60, with --secure.
JEPSEN_TEST = (
    "tests/jepsen_like/test_runs.py::test_a_short_run_with_kill_leader_and_partitions_is_valid"
)
JEPSEN_LONG_TEST = "tests/jepsen_like/test_runs.py::test_ten_minutes_of_every_nemesis_is_valid"
_POWER_LOSS_RUNS = "tests/jepsen_like/test_power_loss_runs.py::"
POWER_LOSS_TEST = (
    _POWER_LOSS_RUNS + "test_a_short_power_loss_run_with_pauses_and_partitions_is_valid"
)
POWER_LOSS_CALIBRATION_TEST = (
    _POWER_LOSS_RUNS + "test_brokers_that_ack_before_fsync_lose_writes_in_9_of_10_power_loss_runs"
)
POWER_LOSS_LONG_TEST = _POWER_LOSS_RUNS + "test_long_power_loss_runs_are_valid"
DEVICES_CLI_TEST = (
    "tests/cli/test_devices.py::"
    "test_the_command_finds_the_clusters_mqtt_listeners_and_reads_the_log_back"
)
MQTT_TLS_TEST = "tests/broker/test_mqtt_tls.py::test_mosquitto_pub_publishes_over_tls"
CONNECT_TEST = (
    "tests/peers/test_kafka_connect.py::"
    "test_a_connect_worker_moves_a_file_through_our_topics_and_resumes_from_its_offsets"
)
CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
BENCH_TEST = "tests/docs/test_doc_commands.py::test_a_benchmark_prints_every_figure_it_documents"
TOUR = "bin/kafkaesque cluster up -n 3 --mqtt --mqtt-rules examples/mqtt-rules.txt"
FAILOVER_TEST = (
    "tests/cli/test_cluster.py::"
    "test_a_killed_leader_is_named_the_others_serve_and_restart_brings_it_back"
)
RESTART_BROKER_TEST = (
    "tests/cli/test_cluster.py::"
    "test_without_restart_a_dead_broker_is_down_in_status_until_restart_broker"
)
ROLLING_RESTART_TEST = (
    "tests/cli/test_cluster_rolling.py::"
    "test_cluster_restart_rolling_restarts_every_broker_of_cluster_up"
)
DECOMMISSION_TEST = (
    "tests/broker/test_decommission.py::"
    "test_a_broker_is_decommissioned_under_load_without_losing_anything"
)
BROKER_ADD_TEST = (
    "tests/cli/test_placement_commands.py::"
    "test_a_joining_broker_is_ready_only_once_broker_add_admitted_it"
)
REASSIGN_TEST = (
    "tests/cli/test_placement_commands.py::"
    "test_topic_reassign_moves_a_partition_and_prints_its_new_replicas"
)
ELECT_LEADERS_TEST = (
    "tests/cli/test_placement_commands.py::"
    "test_topic_elect_leaders_moves_leaderships_to_the_preferred_replicas"
)
BROKER_STOP_TEST = (
    "tests/broker/test_shutdown.py::"
    "test_broker_stop_finds_the_broker_by_its_pid_file_and_stops_it_gracefully"
)

REGISTRY: tuple[Entry, ...] = (
    # README.md
    by(DEMO_TEST, "bin/kafkaesque demo"),  # with --quick: the same pipeline, smaller
    Entry("bin/test", How.CI),
    Entry(TOUR, How.TOUR_CLUSTER),
    here(
        ".venv/bin/kafkaesque topic create readings --partitions 6 --replication-factor 3",
        "created topic readings: 6 partitions, replication factor 3",
    ),
    here(
        "seq 1000 | .venv/bin/kafkaesque produce orders",
        "produced 1,000 of 1,000 records",
        "partition:records 0:334, 1:333, 2:333",
    ),
    here(
        ".venv/bin/kafkaesque consume orders --partition 0 --from-beginning --max 5 --long",
        "0 1 - hello",
        "consumed 5 records from partition 0",
    ),
    here(".venv/bin/kafkaesque status", "brokers (3)"),
    here(
        "mosquitto_sub -h 127.0.0.1 -p 9096 -q 1 -t 'phones/phone-00007/commands' -C 1 -W 30 &",
        '{"command": "set-gain"}',  # the command reached the phone
    ),
    here(
        "sleep 1; .venv/bin/kafkaesque produce commands --key phone-00007 "
        '<<< \'{"command": "set-gain"}\''
    ),
    here("wait"),
    here(
        "mosquitto_pub -h 127.0.0.1 -p 9106 -q 1 -t phones/phone-tour/spectrum -m "
        '"{\\"device\\": \\"phone-tour\\", \\"serial\\": 0, \\"ts_ms\\": $(date +%s%3N)}"'
    ),
    here(
        ".venv/bin/kafkaesque consume readings --from-beginning --max 1",
        '{"device": "phone-tour", "serial": 0, "ts_ms": ',  # the reading landed
    ),
    here(
        ".venv/bin/kafkaesque devices -n 20 --duration 10",
        "20 of 20 devices connected",
        "lost (acknowledged, not in the log) 0",
    ),
    here(
        ".venv/bin/python examples/device_report.py --bootstrap 127.0.0.1:9092",
        "21 devices, ",  # the report of the twenty phones and the reading typed above ...
        " messages, 0 lost, ",  # ... none of it lost
    ),
    by(
        JEPSEN_TEST,
        ".venv/bin/kafkaesque jepsen --nodes 3 --time 60 --nemesis kill-leader,partition",
    ),
    by(BENCH_TEST, r"\.venv/bin/python -m bench\.\w+ --quick", pattern=True),
    # docs/mqtt-bridge.md: the tour's cluster is the "any running cluster" its comment allows; the
    # "existing MQTT broker" on 1883 is a mosquitto of the test's
    Entry("kafkaesque cluster up", How.TOUR_CLUSTER),
    here(
        "cat > rules <<'EOF'\nphones/+/spectrum -> readings key=1\n"
        "phones/+/commands -> commands key=1\nEOF"
    ),
    Entry(
        "kafkaesque mqtt-bridge --upstream 127.0.0.1:1883 --bootstrap 127.0.0.1:9092 "
        "--rules rules --converter json --dead-letter-topic readings-dlq --to-mqtt commands",
        How.BACKGROUND,
    ),
    # docs/kafka.md: kcat against the tour's cluster (its Kafka ports are 9097 + 10 i)
    here("kcat -b 127.0.0.1:9097 -L", " 3 brokers:"),
    here("printf 'k1:hello\\nk2:world\\n' | kcat -b 127.0.0.1:9097 -P -t greetings -K: -z gzip"),
    here("kcat -b 127.0.0.1:9097 -C -t greetings -e -f '%k %s\\n'", "k1 hello\n", "k2 world\n"),
    here(
        ".venv/bin/kafkaesque consume greetings --from-beginning --max 2 --long",
        " k1 hello\n",
        " k2 world\n",
    ),
    here(
        "kcat -b 127.0.0.1:9097 -X auto.offset.reset=earliest -G readers -e -f '%p %o %s\\n' "
        "greetings",
        " hello\n",
        " world\n",
    ),
    # docs/http.md: curl against the tour's cluster (its REST ports are 9098 + 10 i)
    here(
        ".venv/bin/kafkaesque topic create phone-beats --partitions 3 --replication-factor 3 "
        "--compact",
        "created topic phone-beats",
    ),
    here(
        "curl -s -H 'Content-Type: application/vnd.kafka.json.v2+json' --data '{\"records\": "
        '[{"key": "phone-1", "value": {"battery": 81}}, {"key": "phone-2", "value": '
        '{"battery": 64}}]}\' http://127.0.0.1:9098/topics/phone-beats',
        '{"offsets":[{"partition":',
    ),
    here(
        "curl -s --retry 5 -H 'Accept: application/vnd.kafka.json.v2+json' "
        "http://127.0.0.1:9108/topics/phone-beats/latest/phone-1",
        '"key":"phone-1","value":{"battery":81}}',
    ),
    here("curl -s http://127.0.0.1:9098/topics/phone-beats", '{"name":"phone-beats","configs":'),
    here(
        "curl -s -H 'Content-Type: application/vnd.kafka.binary.v2+json' --data '{\"records\": "
        '[{"key": "azE=", "value": "aGVsbG8=", "headers": [{"name": "trace", "value": '
        '"eDE="}]}]}\' http://127.0.0.1:9098/topics/phone-beats/partitions/0',
        '{"offsets":[{"partition":0,"offset":',
    ),
    here(
        "curl -s 'http://127.0.0.1:9098/topics/phone-beats/partitions/0/records?offset=0&"
        "timeout=1000'",
        '"key":"azE=","value":"aGVsbG8=","headers":[{"name":"trace","value":"eDE="}]',
    ),
    here(
        'curl -s --data \'{"topic_name": "invoices", "partitions_count": 3, '
        '"replication_factor": 3, "configs": {"retention.ms": "86400000", "cleanup.policy": '
        '"compact"}}\' http://127.0.0.1:9098/topics',
        '{"topic_name":"invoices","partitions_count":3,"replication_factor":3,',
    ),
    here(
        "curl -s -X PATCH --data '{\"partitions_count\": 6}' http://127.0.0.1:9098/topics/invoices",
        '"altered":{"partitions_count":6}',
    ),
    here("curl -s http://127.0.0.1:9098/consumer-groups", "["),
    here(
        'curl -s --data \'{"topic": "invoices", "to": "datetime", "datetime": '
        '"2026-11-26T08:00:00Z", "dry_run": true}\' '
        "http://127.0.0.1:9098/consumer-groups/billing/reset",
        '"dry_run":true,"offsets":[{"partition":0,"offset":',
    ),
    here("curl -s 'http://127.0.0.1:9098/acls?principal=User:alice'", "[]"),
    # docs/mqtt.md
    here(
        "mosquitto_sub -h 127.0.0.1 -p 9096 -q 1 -i phone-00007 -c "
        "-t 'phones/phone-00007/commands' -E"
    ),
    here(
        "mosquitto_pub -h 127.0.0.1 -p 9106 -q 1 -t 'phones/phone-00007/spectrum' "
        "-m '{\"serial\": 0}'"
    ),
    # docs/mqtt.md, TLS: a broker of the test's with these flags, and mosquitto_pub against it
    by(
        MQTT_TLS_TEST,
        "kafkaesque broker --id 0 --data-dir data --client 127.0.0.1:9092 "
        "--peers 0@127.0.0.1:9093 --controllers 0@127.0.0.1:9094 "
        "--mqtt-tls-listen 127.0.0.1:8883 --mqtt-tls-cert broker.pem --mqtt-tls-key broker.key",
    ),
    by(
        MQTT_TLS_TEST,
        "mosquitto_pub -h 127.0.0.1 -p 8883 --cafile ca.pem -q 1 -t 'phones/p1/spectrum' -m '-71'",
    ),
    # docs/devices.md: the tour's cluster has the same two rules (examples/mqtt-rules.txt)
    here(
        "printf 'phones/+/spectrum -> readings key=1\\nphones/+/commands -> commands key=1\\n'"
        " > rules.txt"
    ),
    Entry("kafkaesque cluster up --mqtt --mqtt-rules rules.txt", How.TOUR_CLUSTER),
    # 2,000 devices for 30 s: too much for this module; the test runs 6 of them by the same
    # command (the cluster from $KAFKAESQUE_BOOTSTRAP, its MQTT listeners from its metadata, the
    # log read back), and the tour runs 20 by the CLI
    by(DEVICES_CLI_TEST, "kafkaesque devices -n 2000 --interval 0.5 --duration 30"),
    # docs/jepsen.md: the closest runs (slow): every nemesis, these nodes, ten minutes
    by(
        JEPSEN_LONG_TEST + "[5]",
        "kafkaesque jepsen --nodes 5 --time 300 --nemesis kill-leader,pause,partition",
    ),
    by(JEPSEN_LONG_TEST + "[3]", "kafkaesque jepsen --nodes 3 --time 120 --nemesis all"),
    here("python -m kafkaesque.cli jepsen --help", "usage: kafkaesque jepsen"),
    # docs/jepsen.md, power loss: the CI run, the calibration and the long runs (slow)
    by(
        POWER_LOSS_TEST,
        "kafkaesque jepsen --nemesis power-loss,pause,partition --time 20 --interval 5 --seed 1",
    ),
    by(
        POWER_LOSS_CALIBRATION_TEST,
        "kafkaesque jepsen --nemesis power-loss --fsync interval --time 30 --seed N",
    ),
    by(
        POWER_LOSS_LONG_TEST + "[3-20-120.0]",
        "kafkaesque jepsen --nodes 3 --time 120 --nemesis power-loss,pause,partition",
    ),
    # docs/operations.md
    Entry("bin/kafkaesque cluster up -n 3", How.UNTIL_READY, while_up="docs/protocol.md"),
    Entry("bin/kafkaesque cluster up -n 3 --base-port 0 --data-dir /tmp/kq", How.UNTIL_READY),
    # docs/operations.md, watching a failover: the tests take the same steps on a cluster of their
    # own (the tour's must keep its brokers), reading the pid from the same cluster-up.json
    by(FAILOVER_TEST, "bin/kafkaesque cluster up -n 3 --restart"),
    by(
        FAILOVER_TEST,
        'kill -9 "$(jq \'.brokers["1"].pid\' .kafkaesque-data/cluster/cluster-up.json)"',
    ),
    by(RESTART_BROKER_TEST, ".venv/bin/kafkaesque cluster restart-broker 1"),
    by(ROLLING_RESTART_TEST, ".venv/bin/kafkaesque cluster restart --rolling"),
    by(BROKER_STOP_TEST, "kafkaesque broker stop --data-dir data --id 0"),
    by(DECOMMISSION_TEST, ".venv/bin/kafkaesque broker remove 3 --bootstrap 127.0.0.1:9092"),
    by(
        BROKER_ADD_TEST,
        ".venv/bin/kafkaesque broker add 3 127.0.0.1:9123 127.0.0.1:9124 "
        "--bootstrap 127.0.0.1:9092",
    ),
    by(
        REASSIGN_TEST, ".venv/bin/kafkaesque topic reassign clicks 1 3,0 --bootstrap 127.0.0.1:9092"
    ),
    by(
        ELECT_LEADERS_TEST,
        ".venv/bin/kafkaesque topic elect-leaders clicks --bootstrap 127.0.0.1:9092",
    ),
    Entry(
        "kafkaesque broker --id 0 --data-dir data --client 127.0.0.1:9092 "
        "--peers 0@127.0.0.1:9093 --controllers 0@127.0.0.1:9094 --admin 127.0.0.1:9095",
        How.UNTIL_READY,
    ),
    # docs/operations.md, changing a live topic: on the tour's cluster, each step's effect shown
    here(
        ".venv/bin/kafkaesque topic create clicks --partitions 2 --replication-factor 3 "
        "--fsync always",
        "created topic clicks: 2 partitions, replication factor 3",
    ),
    here(
        ".venv/bin/kafkaesque topic alter clicks --partitions 4 --retention-ms 86400000",
        "altered topic clicks: partitions=4 replication_factor=3 retention_ms=86400000 ",
    ),
    here(
        ".venv/bin/kafkaesque topic alter clicks --cleanup-policy compact --retention-bytes -1",
        "altered topic clicks: partitions=4 replication_factor=3 retention_ms=86400000 "
        "retention_bytes=- compact=yes fsync=always",
    ),
    here(".venv/bin/kafkaesque topic list", "FSYNC"),
    # docs/operations.md, consumer groups: on the tour's cluster; the group is Empty once the
    # consume has exited, and each admin command's output shows its effect
    here(
        ".venv/bin/kafkaesque topic create visits --partitions 2 --replication-factor 3",
        "created topic visits: 2 partitions, replication factor 3",
    ),
    here("seq 10 | .venv/bin/kafkaesque produce visits", "produced 10 of 10 records"),
    here(
        ".venv/bin/kafkaesque consume visits --group dashboard --from-beginning --max 4",
        "consumed 4 records",
    ),
    # (the tour's cluster holds other groups, whose names widen the columns)
    here(".venv/bin/kafkaesque group list", re.compile(r"\ndashboard +visits +Empty +0\n")),
    here(
        ".venv/bin/kafkaesque group describe dashboard",
        "group dashboard on visits: Empty, 0 member(s)",
        "PARTITION  OWNER  COMMITTED  END  LAG",
    ),
    here(
        ".venv/bin/kafkaesque group reset dashboard --topic visits --to-earliest",
        "dry run: nothing was changed; add --execute to apply",
    ),
    here(
        ".venv/bin/kafkaesque group reset dashboard --topic visits --to-earliest --execute",
        "GROUP      TOPIC   PARTITION  NEW_OFFSET",
    ),
    here(
        ".venv/bin/kafkaesque group reset dashboard --topic visits --shift-by 2 --execute",
        re.compile(r"\ndashboard +visits +0 +\d+\ndashboard +visits +1 +\d+\n"),
    ),
    here(
        ".venv/bin/kafkaesque group describe --all-groups --topic visits",
        "group dashboard on visits: Empty, 0 member(s)",
    ),
    here(".venv/bin/kafkaesque group delete dashboard", "deleted group dashboard"),
    # docs/operations.md, reading from the command line: on the tour's cluster, after the
    # consumer groups' visits (10 records, round-robin over 2 partitions)
    here(".venv/bin/kafkaesque topic offsets visits", re.compile(r"PARTITION +EARLIEST +LATEST\n")),
    here(
        ".venv/bin/kafkaesque topic offsets visits --time 2026-11-26T08:00:00Z",
        re.compile(r"PARTITION +EARLIEST +LATEST +OFFSET\n"),
    ),
    here(
        ".venv/bin/kafkaesque consume visits -o -3 --partition 0 -e",
        "consumed 3 records from partition 0",
    ),
    here(".venv/bin/kafkaesque status --under-replicated", re.compile(r"partitions \(\d+")),
    here(
        "printf 'k1 region=eu hello\\nk2  world\\n' | .venv/bin/kafkaesque produce visits "
        "-f '%k %h %v'",
        "produced 2 of 2 records",
    ),
    here(
        ".venv/bin/kafkaesque consume visits -e -o -2 -f '%k [%h] %v\\n'",
        "k1 [region=eu] hello\n",
        "k2 [] world\n",
    ),
    here(".venv/bin/kafkaesque consume visits -e -o -1 --format json", '"topic": "visits"'),
    here(
        ".venv/bin/kafkaesque status --format json | jq -r '.brokers[] | "
        '"broker \\(.id) \\(.state)"\'',
        "broker 0 up\n",
    ),
    # docs/operations.md, latest value per key: on the tour's cluster; the newest of the three
    # heartbeats, with its place, and a key without a value (exit status 3, not an error)
    here(
        ".venv/bin/kafkaesque topic create heartbeats --partitions 3 --replication-factor 3 "
        "--compact",
        "created topic heartbeats: 3 partitions, replication factor 3",
    ),
    here(
        "printf 'beat 1\\nbeat 2\\nbeat 3\\n' | .venv/bin/kafkaesque produce heartbeats "
        "--key dev-042",
        "produced 3 of 3 records",
    ),
    # docs/security.md: its walk-through, one script on a broker of its own
    *(by(SECURITY_DOC_TEST, command) for command in SECURITY_DOC_COMMANDS),
    # docs/kafka.md's SASL_SSL example (a broker with --kafka-tls and a users file)
    by(
        "tests/broker/test_kafka_security.py::test_kcat_produces_and_consumes_over_sasl_ssl_with_scram",
        "kcat -b 127.0.0.1:9192 -L -X security.protocol=SASL_SSL -X ssl.ca.location=ca.pem "
        "-X sasl.mechanism=SCRAM-SHA-256 -X sasl.username=alice -X sasl.password=alice-secret",
    ),
    # docs/kafka.md's clients' own suites: what `bin/test --peers` (CI's second step) runs
    Entry("bin/fetch-peers", How.CI),
    Entry("python -m pytest -m peers tests/peers/test_kafka_client_suites.py -q", How.CI),
    # docs/kafka.md's Kafka Connect worker and its REST call: the peers tier runs them so
    by(CONNECT_TEST, "java -cp 'peers/kafka/libs/*' " + CONNECT_MAIN + " worker.properties"),
    by(
        CONNECT_TEST,
        "curl -s -X POST -H 'Content-Type: application/json' http://127.0.0.1:8083/connectors "
        """-d '{"name": "file-source", "config": {"connector.class": """
        """"org.apache.kafka.connect.file.FileStreamSourceConnector", "file": "/tmp/in.txt", """
        """"topic": "lines"}}'""",
    ),
    here(".venv/bin/kafkaesque latest heartbeats dev-042", "beat 3"),
    here(".venv/bin/kafkaesque latest heartbeats dev-042 --long", " dev-042 beat 3"),
    here(
        '.venv/bin/kafkaesque latest heartbeats dev-999 || echo "exit status $?"',
        "no value for key 'dev-999'",
        "exit status 3",
    ),
)

# Where each doc's telnet transcripts are replayed: the tour's cluster, or (``while_up``) a
# cluster of their own, fresh as when they were recorded.
TRANSCRIPTS_ON_THE_TOUR = ("README.md",)


# -- reading the docs ---------------------------------------------------------------------------


def all_blocks() -> list[Block]:
    return [block for path in DOCS for block in read_blocks(ROOT, path)]


def all_commands() -> list[Command]:
    return [command for block in all_blocks() if block.is_shell for command in commands(block)]


def entry_of(command: Command) -> Entry:
    found = [entry for entry in REGISTRY if entry.matches(command.text)]
    assert len(found) == 1, f"{command.where}: {len(found)} registry entries for {command.text!r}"
    return found[0]


# -- the docs say what their blocks are ---------------------------------------------------------


def test_every_code_block_is_tagged_or_a_telnet_transcript() -> None:
    problems = []
    for block in all_blocks():
        if block.tag or block.is_transcript:
            continue
        if block.looks_like_shell():
            problems.append(
                f"{block.where}: shell commands in an untagged block: tag it sh or make it text"
            )
        else:
            problems.append(f"{block.where}: untagged block: tag it text (or toml, python, ...)")
    assert not problems, "\n".join(problems)


def test_every_python_block_compiles() -> None:
    blocks = [block for block in all_blocks() if block.tag == "python"]
    assert blocks
    for block in blocks:
        compile("\n".join(block.lines) + "\n", block.where, "exec")


def test_every_documented_command_has_exactly_one_registry_entry() -> None:
    problems = []
    for command in all_commands():
        found = [entry for entry in REGISTRY if entry.matches(command.text)]
        if len(found) != 1:
            problems.append(
                f"{command.where}: {command.text!r} matches {len(found)} registry entries "
                "(add one saying how a test runs it)"
            )
    assert not problems, "\n".join(problems)


def test_every_registry_entry_is_a_documented_command() -> None:
    texts = [command.text for command in all_commands()]
    stale = [entry.command for entry in REGISTRY if not any(map(entry.matches, texts))]
    assert not stale, f"registry entries no doc has any more: {stale}"


def test_the_tests_the_registry_names_exist() -> None:
    for entry in REGISTRY:
        if entry.how is How.TEST:
            path, _, name = entry.node.partition("::")
            name = name.split("[")[0]  # a parametrized test's id names its function
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            assert name in defined, f"{entry.command!r}: no test {entry.node}"
        elif entry.how is How.UNTIL_READY and entry.while_up:
            assert any(b.is_transcript for b in read_blocks(ROOT, entry.while_up)), entry.while_up


def _wait_ready(process: LongRunning, scratch: Path) -> None:
    """Until ``process`` prints ``ready``; on failure, with the tails of the logs it wrote."""
    try:
        process.wait_for("ready", _READY_TIMEOUT_S)
    except AssertionError as exc:
        logs = [
            f"--- {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            for log in sorted(scratch.rglob("*.log"))
        ]
        raise AssertionError("\n".join([str(exc), *logs])) from None


# -- the tour: one cluster, the README's commands in order ---------------------------------------


@dataclass
class Tour:
    rewriter: Rewriter
    env: Env
    cluster: LongRunning
    marker: str
    cwd: Path  # where scripts that name no repository path run (the files they write land there)


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    """The README's ``cluster up``, on a free block of ports and in a temporary directory."""
    scratch = tmp_path_factory.mktemp("docs-tour")
    with running_mosquitto(scratch / "upstream-mqtt") as upstream:
        rewriter = Rewriter(free_port_block(), scratch, upstream_mqtt=upstream.port)
        marker = str(scratch)
        env = Env(marker, f"127.0.0.1:{rewriter.base_port}")
        cluster = LongRunning(rewriter.command(TOUR), env)
        try:
            _wait_ready(cluster, scratch)
            yield Tour(rewriter, env, cluster, marker, scratch / "cwd")
        finally:
            cluster.stop(signal.SIGINT, _STOP_TIMEOUT_S)
            kill_marked(marker)


def _tour_docs() -> list[str]:
    """The docs with something to run on the tour's cluster, in order."""
    found = []
    for path in DOCS:
        blocks = read_blocks(ROOT, path)
        transcripts = path in TRANSCRIPTS_ON_THE_TOUR and any(b.is_transcript for b in blocks)
        texts = [c.text for b in blocks if b.is_shell for c in commands(b)]
        # Tolerant of commands without an entry: the registry test names those.
        runs = (How.HERE, How.BACKGROUND)
        if transcripts or any(e.how in runs and any(map(e.matches, texts)) for e in REGISTRY):
            found.append(path)
    return found


@pytest.mark.parametrize("path", _tour_docs())
def test_the_commands_of_a_doc_run_in_order_on_the_tours_cluster(path: str, tour: Tour) -> None:
    for block in read_blocks(ROOT, path):
        if block.is_transcript and path in TRANSCRIPTS_ON_THE_TOUR:
            transcript = parse(block.lines, block.line)
            address = ("127.0.0.1", tour.rewriter.port(transcript.port))
            problems = replay(transcript, address)
            assert not problems, f"{block.where}: the transcript differs:\n" + "\n".join(problems)
        elif block.is_shell:
            _run_block(block, tour)


_REPO_PATH = re.compile(r"(^|[\s;|&(])(bin|\.venv|examples|bench|docs)/")


def _run_block(block: Block, tour: Tour) -> None:
    """The block's HERE commands as bash scripts, its BACKGROUND ones running meanwhile."""
    entries = [(command, entry_of(command)) for command in commands(block)]
    # In the repository root when the block names a path in it; else in a scratch directory,
    # so that the files a doc writes (a rules file) do not land in the checkout.
    cwd = ROOT if any(_REPO_PATH.search(c.text) for c, _ in entries) else tour.cwd
    cwd.mkdir(exist_ok=True)
    pending: list[tuple[Command, Entry]] = []
    background: list[tuple[Command, Entry, LongRunning]] = []
    try:
        for command, entry in entries:
            if entry.how is How.HERE:
                pending.append((command, entry))
            elif entry.how is How.BACKGROUND:
                _run_script(block, pending, tour, cwd)
                pending = []
                process = LongRunning(tour.rewriter.command(command.text), tour.env, cwd)
                background.append((command, entry, process))
                _wait_ready(process, tour.cwd)
        _run_script(block, pending, tour, cwd)
        for command, entry, process in background:
            status = process.stop(signal.SIGTERM, _STOP_TIMEOUT_S)
            assert status == 0, f"{command.where}: exit {status}:\n{process.output}"
            for text in entry.expect:
                assert _holds(process.output, text), (
                    f"{command.where}: no {text!r} in:\n{process.output}"
                )
    finally:
        for _, _, process in background:
            process.stop(signal.SIGKILL, _STOP_TIMEOUT_S)


def _run_script(block: Block, mine: list[tuple[Command, Entry]], tour: Tour, cwd: Path) -> None:
    if not mine:
        return
    script = "\n".join(tour.rewriter.command(c.text) for c, _ in mine)
    result = run_script(script, tour.env, _SCRIPT_TIMEOUT_S, cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block.where}: exit {result.returncode}:\n{output}"
    for command, entry in mine:
        for text in entry.expect:
            assert _holds(output, text), f"{command.where}: no {text!r} in:\n{output}"


def _holds(output: str, expected: str | re.Pattern[str]) -> bool:
    if isinstance(expected, re.Pattern):
        return expected.search(output) is not None
    return expected in output


def test_the_tours_cluster_stops_on_ctrl_c_and_leaves_no_process(tour: Tour) -> None:
    status = tour.cluster.stop(signal.SIGINT, _STOP_TIMEOUT_S)
    assert status == 0, f"exit {status}:\n{tour.cluster.output}"
    assert "stopping" in tour.cluster.output.splitlines()
    assert not marked_processes(tour.marker), "processes outlived the cluster"


# -- long-running commands ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [e for e in REGISTRY if e.how is How.UNTIL_READY],
    ids=lambda e: " ".join(e.command.split()[:7]),
)
def test_a_long_running_command_prints_ready_and_stops_on_sigterm(
    entry: Entry, tmp_path: Path
) -> None:
    rewriter = Rewriter(free_port_block(), tmp_path)
    marker = str(tmp_path)
    env = Env(marker, f"127.0.0.1:{rewriter.base_port}")
    process = LongRunning(rewriter.command(entry.command), env)
    try:
        _wait_ready(process, tmp_path)
        if entry.while_up:
            for block in read_blocks(ROOT, entry.while_up):
                if block.is_transcript:
                    transcript = parse(block.lines, block.line)
                    problems = replay(transcript, ("127.0.0.1", rewriter.port(transcript.port)))
                    assert not problems, f"{block.where}: differs:\n" + "\n".join(problems)
        status = process.stop(signal.SIGTERM, _STOP_TIMEOUT_S)
        assert status == 0, f"exit {status}:\n{process.output}"
        assert not marked_processes(marker), "processes outlived the command"
    finally:
        process.stop(signal.SIGKILL, _STOP_TIMEOUT_S)
        kill_marked(marker)


# -- benchmarks ---------------------------------------------------------------------------------

_BENCH = re.compile(r"\.venv/bin/python -m bench\.(\w+) --quick")


def _documented_benchmarks() -> list[str]:
    return [m.group(1) for c in all_commands() if (m := _BENCH.fullmatch(c.text))]


@pytest.mark.slow
@pytest.mark.parametrize("name", _documented_benchmarks())
def test_a_benchmark_prints_every_figure_it_documents(name: str, tmp_path: Path) -> None:
    """Its docstring's ``Ends with RESULT a=… b=…`` names every figure of the RESULT line."""
    module = ROOT / "bench" / f"{name}.py"
    doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or ""
    documented = re.search(r"RESULT ((?:\w+=…\s*)+)", doc)
    assert documented, f"bench/{name}.py does not document its RESULT line"
    names = re.findall(r"(\w+)=…", documented.group(1))
    marker = str(tmp_path)
    env = Env(marker, "")
    try:
        result = run_script(f".venv/bin/python -m bench.{name} --quick", env, 600.0)
    finally:
        kill_marked(marker)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, result.stdout[-3000:]
    figures = dict(word.split("=", 1) for word in lines[0].split()[1:])
    assert set(names) <= set(figures), f"missing {set(names) - set(figures)} in {lines[0]}"
    for figure in names:
        float(figures[figure])  # a number (nan: not measured, which the benchmark explains)
