"""Apache Kafka itself (4.3.1, the jars ``bin/fetch-peers`` fetches), the peer ``bench.kafka``
measures beside Kafkaesque in the same run.

``KafkaCluster`` starts ``n`` Kafka servers in KRaft mode on free loopback ports, each both broker
and controller (a static quorum of all ``n``), in a scratch directory: one JVM per server, its
heap capped (``heap``, 1 GiB by default: the machine's memory is shared with our brokers and the
load generators), its data and log under ``directory``. Topics default to ``n`` replicas and
``min.insync.replicas=2``. With ``fsync_every_message`` every server has
``log.flush.interval.messages=1``: each replica fsyncs a produce before it counts, as our brokers
do by default (Kafka's own default acknowledges from the page cache and leaves flushing to the
OS).

It is a context manager: on entry it formats each server's storage, starts the JVMs and waits,
bounded, until a client sees every broker; on exit it kills every JVM by its PID and waits for
it, whatever happened (no process outlives the block).
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from kafkaesque.local_cluster import free_ports

from ._kafka_dist import kafka_classpath

SERVER = "kafka.Kafka"
STORAGE = "kafka.tools.StorageTool"
DEFAULT_HEAP = "1g"
# The JVM options of Kafka's bin/kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS).
JVM_OPTIONS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


class KafkaClusterError(RuntimeError):
    """Kafka did not start, or did not become ready in time."""


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding (Uuid.toString)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaCluster:
    """``n`` KRaft servers (broker and controller each) on loopback in ``directory``; a context
    manager that always kills them. ``KafkaClusterError`` from ``__enter__`` if formatting fails,
    a server exits, or the brokers are not all visible within ``ready_timeout`` seconds (the
    processes are stopped first). ``extra`` adds server properties."""

    def __init__(
        self,
        directory: Path,
        n: int = 3,
        *,
        fsync_every_message: bool = False,
        heap: str = DEFAULT_HEAP,
        extra: Mapping[str, str] | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        if n < 1:
            raise ValueError("a cluster has at least one server")
        self.classpath = kafka_classpath()  # KafkaDistMissing says how to fetch the jars
        self.directory = directory
        self.n = n
        self.heap = heap
        self.fsync_every_message = fsync_every_message
        self.extra = dict(extra or {})
        self.ready_timeout = ready_timeout
        ports = free_ports(2 * n)
        self.broker_ports = ports[:n]
        self.controller_ports = ports[n:]
        self.procs: list[subprocess.Popen[bytes]] = []  # started by __enter__

    @property
    def bootstrap(self) -> str:
        """Every broker's ``host:port``, comma-separated (a client's bootstrap.servers)."""
        return ",".join(f"127.0.0.1:{port}" for port in self.broker_ports)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def _properties(self, node: int) -> str:
        voters = ",".join(
            f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(self.controller_ports)
        )
        replicas = str(self.n)
        isr = str(min(2, self.n))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node + 1),
            "controller.quorum.voters": voters,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.broker_ports[node]},"
                f"CONTROLLER://127.0.0.1:{self.controller_ports[node]}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_ports[node]}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.directory / f"node-{node + 1}" / "data"),
            "num.partitions": "3",
            "default.replication.factor": replicas,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            **({"log.flush.interval.messages": "1"} if self.fsync_every_message else {}),
            **self.extra,
        }
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every server's output, for an error message."""
        out = []
        for node in range(self.n):
            path = self.directory / f"node-{node + 1}" / "server.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- node {node + 1}\n" + "\n".join(tail))
        return "\n".join(out)

    def _java(self, main_class: str, *args: str, heap: str = "256m") -> list[str]:
        return ["java", f"-Xmx{heap}", f"-Xms{heap}", *JVM_OPTIONS, "-cp", self.classpath,
                main_class, *args]  # fmt: skip

    def _format(self, cluster_id: str) -> None:
        """Each server's storage formatted for the cluster (in parallel: a JVM each)."""
        formats = []
        for node in range(self.n):
            props = self.directory / f"node-{node + 1}" / "server.properties"
            formats.append(
                subprocess.Popen(
                    self._java(STORAGE, "format", "-t", cluster_id, "-c", str(props)),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        for node, proc in enumerate(formats):
            try:
                output, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for other in formats:
                    other.kill()
                    other.wait()
                raise KafkaClusterError("kafka-storage format did not end in 120 s") from None
            if proc.returncode != 0:
                raise KafkaClusterError(
                    f"kafka-storage format of node {node + 1} failed ({proc.returncode}):\n"
                    + output.decode(errors="replace")[-2000:]
                )

    def _visible_brokers(self) -> int:
        """How many brokers a client sees (0 while any broker port refuses connections: the
        client would log each refusal)."""
        import confluent_kafka.admin

        for port in self.broker_ports:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return 0
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            return len(admin.list_topics(timeout=2).brokers)
        except confluent_kafka.KafkaException:
            return 0

    def __enter__(self) -> KafkaCluster:
        deadline = time.monotonic() + self.ready_timeout
        try:
            for node in range(self.n):
                home = self.directory / f"node-{node + 1}"
                home.mkdir(parents=True, exist_ok=True)
                (home / "server.properties").write_text(self._properties(node))
            self._format(_cluster_id())
            for node in range(self.n):
                home = self.directory / f"node-{node + 1}"
                with open(home / "server.log", "wb") as log:
                    self.procs.append(
                        subprocess.Popen(
                            self._java(SERVER, str(home / "server.properties"), heap=self.heap),
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, "LOG_DIR": str(home)},
                        )
                    )
            while True:
                for node, proc in enumerate(self.procs):
                    if proc.poll() is not None:
                        raise KafkaClusterError(
                            f"Kafka server {node + 1} exited ({proc.returncode}):\n"
                            + self.log_tail()
                        )
                if self._visible_brokers() == self.n:
                    break
                if time.monotonic() > deadline:
                    raise KafkaClusterError(
                        f"Kafka's {self.n} brokers not all visible within "
                        f"{self.ready_timeout:.0f} s:\n" + self.log_tail()
                    )
                time.sleep(0.5)
        except BaseException:
            self.__exit__()
            raise
        return self

    def create_topic(self, name: str, partitions: int, timeout: float = 60.0) -> None:
        """A topic of ``partitions`` partitions, one replica per server,
        ``min.insync.replicas=2``; returns once every partition has a leader and a full ISR.
        ``KafkaClusterError`` after ``timeout`` seconds."""
        import confluent_kafka.admin
        import confluent_kafka.cimpl

        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": self.bootstrap})
        config = {"min.insync.replicas": str(min(2, self.n))}
        new = confluent_kafka.cimpl.NewTopic(name, partitions, self.n, config=config)
        try:
            admin.create_topics([new], request_timeout=timeout)[name].result(timeout)
        except confluent_kafka.KafkaException as error:
            raise KafkaClusterError(f"topic {name} not created: {error}") from error
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=5).topics.get(name)
            parts = topic.partitions.values() if topic is not None and not topic.error else []
            if len(parts) == partitions and all(
                p.leader >= 0 and len(p.isrs) == self.n for p in parts
            ):
                return
            time.sleep(0.2)
        raise KafkaClusterError(f"topic {name} has no leader or a short ISR after {timeout} s")

    def __exit__(self, *exc_info: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
