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
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"  # kafka-producer-perf-test


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


def run_kafka_tool(
    main_class: str, args: Sequence[str], *, timeout: float = 60.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's programs to its end (bounded by ``timeout``), its output captured.

    The JVM gets a small heap: these are clients, and the machine's cores and memory are shared
    with the brokers under test.
    """
    command = ["java", "-Xmx256m", "-cp", kafka_classpath(), main_class, *args]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
