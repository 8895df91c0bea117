"""Membership and placement from the CLI (issue 37, point 7), against one four-broker cluster
(three members and a spare): a ``--join`` broker says ``ready`` only once ``broker add`` admitted
it; ``topic reassign`` moves a partition onto it; ``topic elect-leaders`` gives leaderships back
to the preferred replicas."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO

import pytest

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import PartitionRow

from .test_no_traceback import InProcess

_READY_S = 60.0  # a broker starting on two busy cores
_NOT_READY_S = 1.5  # long enough for a broker that says `ready` at once to have said it


class Lines:
    """The lines a process writes to a pipe, read by a thread so that waits can time out."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[bytes]) -> None:
        for raw in pipe:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """The first line (not seen before) starting with ``prefix`` within ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        return None


class Spare:
    """Broker 3 of the cluster, started with ``--join`` by the test (its stdout read here)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.id = cluster.n
        ports = cluster.ports[self.id]
        self.peer = f"127.0.0.1:{ports.peer}"
        self.controller = f"127.0.0.1:{ports.controller}"
        self.stderr = open(os.path.join(cluster.data_dir, "joining.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cluster.command(self.id),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        self.out = Lines(self.proc.stdout)

    def admitted(self) -> bool:
        with Client(self.cluster.bootstrap) as client:
            return self.id in client.refresh_metadata().brokers

    def admit(self) -> None:
        """Admit it through the client library, unless a test did already."""
        if not self.admitted():
            with Client(self.cluster.bootstrap) as client:
                client.add_broker(self.id, self.peer, self.controller)
        self.cluster.wait_ready(_READY_S, brokers=[0, 1, 2])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No leader balancing: only `topic elect-leaders` moves a leadership to its preferred replica.
    with LocalCluster(
        str(tmp_path_factory.mktemp("placement")),
        3,
        spare=1,
        extra_args=["--leader-balance-rate", "0"],
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spare(cluster: LocalCluster) -> Iterator[Spare]:
    joining = Spare(cluster)
    try:
        yield joining
    finally:
        joining.stop()


@pytest.fixture
def cli(cluster: LocalCluster, capfdbinary: pytest.CaptureFixture[bytes]) -> InProcess:
    return InProcess(cluster, capfdbinary)


def test_a_joining_broker_is_ready_only_once_broker_add_admitted_it(
    spare: Spare, cli: InProcess
) -> None:
    assert spare.out.wait_for(f"broker {spare.id} client=", _READY_S), spare.out.seen
    # Listening, not admitted: no `ready` yet (it used to come right after the line above).
    assert spare.out.wait_for("ready", _NOT_READY_S) is None, spare.out.seen
    assert not spare.admitted()
    # Bad input: one clear line each, exit 1, nothing sent.
    assert "needs the new broker's peer" in cli.fails("broker", "add", str(spare.id))
    assert "is not host:port" in cli.fails("broker", "add", str(spare.id), "x", spare.controller)
    # Admitted through the CLI: it registers, then says `ready`.
    out = cli.ok("broker", "add", str(spare.id), spare.peer, spare.controller)
    assert out.startswith(f"added broker {spare.id} (peer {spare.peer}"), out
    assert spare.out.wait_for("ready", _READY_S) == "ready", spare.out.seen
    assert spare.admitted()
    # Again: it is a member already, and saying +OK would hide a typo'd id.
    err = cli.fails("broker", "add", str(spare.id), spare.peer, spare.controller)
    assert f"broker {spare.id} is already a member" in err, err


def test_topic_reassign_moves_a_partition_and_prints_its_new_replicas(
    spare: Spare, cli: InProcess
) -> None:
    spare.admit()
    cli.ok("topic", "create", "placed", "--partitions", "2", "--replication-factor", "2")
    target = f"{spare.id},0"
    out = cli.ok("topic", "reassign", "placed", "1", target)
    assert out.startswith("reassigned placed partition 1: replicas "), out
    assert f"-> {target} (leader " in out, out
    with Client(spare.cluster.bootstrap) as client:
        assert client.describe_topic("placed").partitions[1].replicas == (spare.id, 0)
    for args, message in (
        (("topic", "reassign", "placed", "9", "0,1"), "has no partition 9"),
        (("topic", "reassign", "placed", "0", "0,0"), "a broker is listed twice"),
        (("topic", "reassign", "placed", "0", "0,x"), "broker ids separated by commas"),
        (("topic", "reassign", "placed", "0", "0,7"), "no broker 7 is registered"),
        (("topic", "reassign", "no-such", "0", "0,1"), "UNKNOWN_TOPIC"),
    ):
        err = cli.fails(*args)
        assert message in err, (args, err)


def _leaders_known(client: Client, topic: str) -> list[PartitionRow]:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        rows = list(client.describe_topic(topic).partitions)
        if all(r.leader is not None for r in rows):
            return rows
        time.sleep(0.1)
    raise AssertionError(f"{topic} has a partition without a leader: {rows}")


def test_topic_elect_leaders_moves_leaderships_to_the_preferred_replicas(
    spare: Spare, cli: InProcess
) -> None:
    spare.admit()
    cli.ok("topic", "create", "elect", "--partitions", "2", "--replication-factor", "3")
    with Client(spare.cluster.bootstrap) as client:
        for row in _leaders_known(client, "elect"):
            # The same brokers, another one first: the leader stays, and is not preferred.
            assert row.leader is not None
            others = [b for b in row.replicas if b != row.leader]
            client.reassign("elect", row.partition, (others[0], row.leader, *others[1:]))
        rows = _leaders_known(client, "elect")
        assert all(r.leader != r.replicas[0] for r in rows), rows
    out = cli.ok("topic", "elect-leaders", "elect", "--format", "json")
    table = json.loads(out)
    assert [r["partition"] for r in table] == [0, 1], table
    assert all(r["election"] == "elected" and r["leader"] == r["preferred"] for r in table), table
    with Client(spare.cluster.bootstrap) as client:
        assert all(r.leader == r.replicas[0] for r in client.describe_topic("elect").partitions)
        # Once more: nothing to move.
        assert client.elect_leaders("elect", 1) == 0
    text = cli.ok("topic", "elect-leaders")
    assert text.splitlines()[0].split() == ["TOPIC", "PARTITION", "LEADER", "PREFERRED", "ELECTION"]
    rows_shown = [line.split() for line in text.splitlines()[1:]]
    assert any(r[:2] == ["elect", "1"] and r[2:] == [r[3], r[3], "already"] for r in rows_shown)
    assert "pending" not in text, text
    for args, message in (
        (("topic", "elect-leaders", "no-such"), "UNKNOWN_TOPIC"),
        (("topic", "elect-leaders", "elect", "5"), "has no partition 5"),
        (("topic", "elect-leaders", "elect", "--timeout", "0"), "--timeout must be more than 0"),
    ):
        err = cli.fails(*args)
        assert message in err, (args, err)
