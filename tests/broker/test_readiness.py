"""A broker answers from the cluster's metadata only once it knows it (issue 23), real processes.

Until a broker is ready (its registration, sent once its metadata replica caught up with the
controller quorum, is applied here: see ``Broker.ready``) every command that needs the metadata
answers the retriable ``NOT_READY``; PING and HELP are answered; MQTT CONNECT gets "server
unavailable". A CREATE while the cluster starts waits for the configured brokers to register
instead of refusing a replication factor that is only transiently too high.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kafkaesque.client import Client, ClientConfig, KafkaesqueError, RetryPolicy
from kafkaesque.client._retry import NO_RETRY
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import BrokerRow, DataReply, ErrorCode, ErrorReply, OkReply, PartitionRow
from kafkaesque.protocol.mqtt import Connack, ConnackReturnCode, MqttReasonCode, MqttVersion

from .line_client import Answer, LineClient
from .mqtt_helpers import RawMqtt

TOPIC = "jt"
# What a restarted broker is hammered with, pipelined (all sent, then all answers read): the two
# metadata reads, a read, and a publish (which auto-creates a missing topic). Each must succeed
# once per restart.
HAMMER = (
    f"METADATA {TOPIC}",
    f"FETCH {TOPIC} 0 0",
    f"DESCRIBE {TOPIC}",
    f"PUBS {TOPIC} hello",
)
_HAMMER_FOR_S = 60.0  # bound of one restart's hammering (it ends at the first full success)
_PAUSE_S = 0.01


def _outcome(answer: Answer) -> str:
    """``OK`` for a success, else the error's code (a list answer is a success)."""
    if isinstance(answer, ErrorReply):
        return answer.code.name
    assert isinstance(answer, OkReply | DataReply | list), answer
    return "OK"


def _hammer(address: tuple[str, int], seen: Counter[str]) -> None:
    """Send ``HAMMER`` to ``address`` from the moment its port accepts, again and again, until
    each command has succeeded once. Every answer must be a success or a retriable error other
    than UNKNOWN_TOPIC (the topic exists all along)."""
    succeeded: set[str] = set()
    deadline = time.monotonic() + _HAMMER_FOR_S
    while succeeded != set(HAMMER):
        assert time.monotonic() < deadline, f"no success for {set(HAMMER) - succeeded}: {seen}"
        try:
            with LineClient(address, timeout=15) as client:
                while succeeded != set(HAMMER) and time.monotonic() < deadline:
                    client.send("".join(f"{line}\r\n" for line in HAMMER))
                    for line in HAMMER:
                        outcome = _outcome(client.answer())
                        seen[outcome] += 1
                        if outcome == "OK":
                            succeeded.add(line)
                            continue
                        code = ErrorCode[outcome]
                        assert code is not ErrorCode.UNKNOWN_TOPIC, f"{line!r}: {seen}"
                        assert code.retriable, f"{line!r} answered {outcome}"
                    time.sleep(_PAUSE_S)
        except (ConnectionError, OSError):  # not listening yet, or gone: again
            seen["CONN"] += 1
            time.sleep(_PAUSE_S)


def test_a_restarted_broker_never_answers_unknown_topic(tmp_path: Path) -> None:
    """Issue 23: right after a restart a broker answered ``UNKNOWN_TOPIC no topic 'jt'`` for a
    topic that exists. Now it answers NOT_READY (or serves) until it knows the metadata."""
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as client:
            assert client.ok(f"CREATE {TOPIC} 3 3") == "created"
            for i in range(5):
                client.ok(f"PUBS {TOPIC} m{i}")
        seen: Counter[str] = Counter()
        for restart in range(4):
            victim = 1 + restart % 2
            cluster.kill(victim)
            cluster.start(victim)
            _hammer(cluster.client_address(victim), seen)
            cluster.wait_ready()
        print("answers while restarting:", dict(seen))
        # The topic was never created twice, nor changed: still the one that was created.
        with LineClient(cluster.client_address(0)) as client:
            assert client.ok(f"CREATE {TOPIC} 3 3") == "exists"


def _wait_registered(address: tuple[str, int], brokers: int, timeout: float = 60.0) -> None:
    """Until ``address`` answers METADATA with ``brokers`` broker rows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with LineClient(address, timeout=5) as client:
                answer = client.call("METADATA")
            rows = answer if isinstance(answer, list) else []
            if sum(isinstance(row, BrokerRow) for row in rows) >= brokers:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{address} did not list {brokers} brokers in {timeout:.0f} s")


def test_create_at_cluster_start_waits_for_the_configured_brokers(tmp_path: Path) -> None:
    """Issue 23: at cluster start CREATE answered ``INVALID_CONFIG replication_factor 3 > 2
    registered brokers``, a non-retriable code for a transient state. With 2 of the 3
    configured brokers registered, a CREATE with replication factor 3 now waits for the third
    (or says retriable); one above the configured size is still INVALID_CONFIG."""
    cluster = LocalCluster(str(tmp_path), 3)
    try:
        cluster.start(0)
        cluster.start(1)
        _wait_registered(cluster.client_address(0), 2)
        cluster.start(2)  # registers a second or so from now, under the CREATE's feet
        answers: list[Answer] = []
        deadline = time.monotonic() + 60
        with LineClient(cluster.client_address(0)) as client:
            while time.monotonic() < deadline:
                answers.append(client.call(f"CREATE {TOPIC} 3 3"))
                if isinstance(answers[-1], OkReply):
                    break
                assert isinstance(answers[-1], ErrorReply), answers
                assert answers[-1].code.retriable, answers
                time.sleep(0.1)
            assert answers[-1] == OkReply("created"), answers
            partitions = [
                r for r in client.rows(f"DESCRIBE {TOPIC}") if isinstance(r, PartitionRow)
            ]
            assert [sorted(r.replicas) for r in partitions] == [[0, 1, 2]] * 3, partitions
            too_many = client.call("CREATE other 1 4")
            assert isinstance(too_many, ErrorReply), too_many
            assert too_many.code is ErrorCode.INVALID_CONFIG, too_many
    finally:
        cluster.stop_all()


def test_a_broker_that_does_not_know_the_cluster_says_so(tmp_path: Path) -> None:
    """One broker of three, started alone, cannot reach a controller quorum: it answers PING
    and HELP, NOT_READY to what needs the metadata (retriable: the client library retries it),
    and MQTT CONNECT with "server unavailable" in both protocol versions. Once a second broker
    is up, the library's retried call succeeds through that same broker."""
    cluster = LocalCluster(str(tmp_path), 3, mqtt=True)
    try:
        cluster.start(0)
        address = cluster.client_address(0)
        deadline = time.monotonic() + 60
        while True:
            try:
                client = LineClient(address, timeout=10)
                break
            except OSError:
                assert time.monotonic() < deadline, "broker 0 never listened"
                time.sleep(0.05)
        with client:
            assert client.ok("PING") == "PONG"
            assert isinstance(client.call("HELP"), list)
            for line in ("METADATA", "LIST", f"PUBS {TOPIC} x", f"CREATE {TOPIC} 1 1"):
                answer = client.call(line)
                assert isinstance(answer, ErrorReply), (line, answer)
                assert answer.code is ErrorCode.NOT_READY, (line, answer)
        for version, refused in (
            (MqttVersion.V311, ConnackReturnCode.SERVER_UNAVAILABLE),
            (MqttVersion.V5, MqttReasonCode.SERVER_UNAVAILABLE),
        ):
            device = RawMqtt(cluster.mqtt_address(0), version)
            try:
                assert device.connect("early") == Connack(False, int(refused))
                assert device.closed_by_server()
            finally:
                device.close()
        bootstrap = f"{address[0]}:{address[1]}"
        with Client(bootstrap, config=ClientConfig(retry=NO_RETRY)) as impatient:
            with pytest.raises(KafkaesqueError) as raised:
                impatient.list_topics()
            assert raised.value.code is ErrorCode.NOT_READY and raised.value.retriable
        patient = RetryPolicy(max_attempts=200, backoff_ms=50, backoff_max_ms=200)
        starter = threading.Timer(1.0, cluster.start, args=(1,))
        starter.start()
        try:
            with Client(bootstrap, config=ClientConfig(retry=patient)) as client_lib:
                assert client_lib.list_topics() == []  # retried through NOT_READY
        finally:
            starter.join()
    finally:
        cluster.stop_all()
