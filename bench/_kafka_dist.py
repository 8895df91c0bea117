"""Apache Kafka's own programs (broker, command-line tools, Java client, Connect), pinned in
peers/kafka/pom.xml and fetched by ``bin/fetch-peers`` into peers/kafka/libs/.

The tests of ``bin/test --peers`` and the benchmarks that measure Kafka beside us (``bench.kafka``)
run them from that directory's jars with the machine's ``java`` (17 or later), as Kafka's own
``bin/*.sh`` scripts do: ``java -cp 'libs/*' <main class> <arguments>``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KAFKA_LIBS = os.path.join(ROOT, "peers", "kafka", "libs")
FETCH_PEERS = os.path.join(ROOT, "bin", "fetch-peers")

# The main class behind each of Kafka's scripts (bin/<name>.sh in Kafka 4.3's distribution).
TOPICS = "org.apache.kafka.tools.TopicCommand"
GROUPS = "org.apache.kafka.tools.GroupsCommand"
CONNECT_DISTRIBUTED = "org.apache.kafka.connect.cli.ConnectDistributed"
CONFIGS = "kafka.admin.ConfigCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
PRODUCER_PERF_TEST = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERF_TEST = "org.apache.kafka.tools.ConsumerPerformance"
# Kafka's system-test clients (tests/kafkatest's verifiable_producer.py and verifiable_consumer.py
# run them): one JSON event per line on stdout, for each acknowledgement, record and rebalance.
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"

# A log4j2 configuration that writes everything at INFO into the file named by the system
# property ``kafkaesque.log.file``: long-running programs (a Connect worker) log there, where a
# test can read what the program asked of us and why it failed.
FILE_LOG_CONFIG = os.path.join(ROOT, "peers", "kafka", "log4j2-file.properties")


class KafkaDistMissing(RuntimeError):
    """Kafka's jars (or java) are not on this machine; ``bin/fetch-peers`` fetches the jars."""


def kafka_classpath() -> str:
    """The class path of Kafka's jars, or :class:`KafkaDistMissing` saying how to fetch them."""
    if shutil.which("java") is None:
        raise KafkaDistMissing("java is not installed (Kafka's programs need Java 17 or later)")
    if not os.path.isfile(os.path.join(KAFKA_LIBS, ".stamp")):
        raise KafkaDistMissing(f"Kafka's jars are not in {KAFKA_LIBS}: run {FETCH_PEERS}")
    return os.path.join(KAFKA_LIBS, "*")


def kafka_available() -> bool:
    """Whether :func:`kafka_classpath` would answer (for a test's skip condition)."""
    try:
        kafka_classpath()
    except KafkaDistMissing:
        return False
    return True


def kafka_command(
    main_class: str, args: Sequence[str], *, heap: str = "256m", log_file: str | None = None
) -> list[str]:
    """The command line that runs one of Kafka's programs with a ``heap`` sized JVM.

    With ``log_file`` its log goes there at INFO (:data:`FILE_LOG_CONFIG`); without, log4j2's
    default (errors on the console) applies, as for the command-line tools.
    """
    jvm = [f"-Xmx{heap}"]
    if log_file is not None:
        jvm += [
            f"-Dlog4j2.configurationFile={FILE_LOG_CONFIG}",
            f"-Dkafkaesque.log.file={log_file}",
        ]
    return ["java", *jvm, "-cp", kafka_classpath(), main_class, *args]


def run_kafka_tool(
    main_class: str, args: Sequence[str], *, timeout: float = 60.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's programs to its end (bounded by ``timeout``), its output captured.

    The JVM gets a small heap: these are clients, and the machine's cores and memory are shared
    with the brokers under test.
    """
    return subprocess.run(
        kafka_command(main_class, args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
