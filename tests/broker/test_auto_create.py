"""Topics created on first use (Kafka's ``auto.create.topics.enable``), over real sockets.

A publish (``PUBS``, ``PUB``, ``PUBB``) or a ``SUBS`` that names a missing topic creates it with
the broker's defaults and is then carried out in the same request; reads (``FETCH``, ``CONS``)
do not create. The module's cluster starts empty; the tests that need other settings start a
one-broker cluster of their own.
"""

from __future__ import annotations

import argparse
import socket
import threading

import pytest
from kafkaesque.cli.broker import add_parser, config_of

from kafkaesque.broker import ConfigError, config_from_mapping
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    EndReply,
    ErrorCode,
    ErrorReply,
    MessageRow,
    OkReply,
    PartitionRow,
    Reply,
    TopicRow,
)
from kafkaesque.storage import Record, build_batch

from .line_client import Answer, LineClient


def _code(reply: Answer) -> ErrorCode | None:
    return reply.code if isinstance(reply, ErrorReply) else None


def _topic_row(c: LineClient, topic: str) -> TopicRow:
    rows = c.rows(f"DESCRIBE {topic}")
    row = rows[0]
    assert isinstance(row, TopicRow), rows
    return row


def _listed(c: LineClient) -> list[str]:
    return [r.topic for r in c.rows("LIST") if isinstance(r, TopicRow)]


def test_the_first_pubs_on_an_empty_cluster_creates_the_topic(
    broker_cluster: LocalCluster,
) -> None:
    # The telnet session the seed's users typed, without any CREATE.
    with LineClient(broker_cluster.client_address(1)) as c:
        assert _listed(c) == []
        published = c.ok("PUBS newtopic hello")
        partition, offset = map(int, published.split())
        sub = c.ok("SUBS newtopic billing")
        rows = c.rows(f"CONS newtopic {sub} 0")
        row = _topic_row(c, "newtopic")
    assert [(m.partition, m.offset, m.value) for m in rows if isinstance(m, MessageRow)] == [
        (partition, offset, b"hello")
    ]
    end = rows[-1]
    assert isinstance(end, EndReply) and dict(end.next_offsets).keys() == {0, 1, 2}
    # The broker's defaults: 3 partitions, min(3, registered brokers) = 3 replicas.
    assert (row.partitions, row.replication_factor) == (3, 3)


def test_subs_creates_a_missing_topic_and_pub_and_pubb_do_too(
    broker_cluster: LocalCluster,
) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        sub = c.ok("SUBS subscribed-first readers")
        assert _topic_row(c, "subscribed-first").partitions == 3
        assert c.ok("PUBS subscribed-first after").split()[0] in {"0", "1", "2"}
        assert c.rows(f"CONS subscribed-first {sub} 0")[-1] is not None
        assert c.ok("PUB by-pub key=k v").split()[0].isdigit()
        assert _topic_row(c, "by-pub").partitions == 3
        batch = build_batch([Record(value=b"x")])
        c.send(b"PUBB by-pubb 2 %d\r\n" % len(batch) + batch + b"\r\n")
        reply = c.answer()
        assert not isinstance(reply, ErrorReply | list), reply
        # A partition the defaults do not give: the topic is there, the publish is refused.
        missing = c.call("PUB by-pub-partition partition=7 x")
        assert _code(missing) is ErrorCode.UNKNOWN_PARTITION
        assert _topic_row(c, "by-pub-partition").partitions == 3


def test_pipelined_publishes_to_a_new_topic_keep_their_order(
    broker_cluster: LocalCluster,
) -> None:
    # All sent at once, before the topic exists: the first creates it, the others wait for it,
    # and they are appended in the order sent (one key: one partition).
    lines = b"".join(b"PUB ordered key=same m%d\r\n" % i for i in range(50))
    with LineClient(broker_cluster.client_address(2)) as c:
        c.send(lines + b"PUBS ordered last\r\nFETCH ordered 0 0 format=text\r\n")
        acks = [c.answer() for _ in range(51)]
        c.answer()  # the FETCH's rows: read below from the partition the key went to
        oks = [a for a in acks if isinstance(a, OkReply)]
        assert len(oks) == 51, acks
        keyed = [tuple(map(int, a.text.split())) for a in oks[:50]]
        partitions = {p for p, _ in keyed}
        assert len(partitions) == 1
        offsets = [o for _, o in keyed]
        assert offsets == sorted(offsets) and len(set(offsets)) == 50
        rows = c.rows(f"FETCH ordered {partitions.pop()} 0 format=text")
    values = [m.value for m in rows if isinstance(m, MessageRow) and m.value != b"last"]
    assert values == [b"m%d" % i for i in range(50)]


def test_reads_and_internal_names_create_nothing(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        assert _code(c.call("FETCH never-fetched 0 0")) is ErrorCode.UNKNOWN_TOPIC
        assert _code(c.call("DESCRIBE never-described")) is ErrorCode.UNKNOWN_TOPIC
        assert _code(c.call("CONS never-consumed 0.abc 0")) is not None
        assert _code(c.call("PUBS __x m")) is ErrorCode.INVALID_TOPIC
        assert _code(c.call("PUB __x m")) is ErrorCode.INVALID_TOPIC
        assert _code(c.call("SUBS __x g")) is ErrorCode.UNKNOWN_TOPIC
        assert _code(c.call("PUBS bad/name m")) is ErrorCode.INVALID_TOPIC
        listed = _listed(c)
    for name in ("never-fetched", "never-described", "never-consumed", "__x"):
        assert name not in listed


def _publish_at_once(addresses: list[tuple[str, int]], line: bytes) -> list[bytes]:
    """Send ``line`` to every address at the same moment (threads released by one barrier);
    each broker's raw reply line."""
    socks = [socket.create_connection(a, timeout=60) for a in addresses]
    barrier = threading.Barrier(len(socks))
    replies: list[bytes] = [b""] * len(socks)

    def send(i: int) -> None:
        barrier.wait(timeout=30)
        socks[i].sendall(line)
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = socks[i].recv(4096)
            if not chunk:
                break
            data += chunk
        replies[i] = data

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(socks))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
    finally:
        for s in socks:
            s.close()
    return replies


def test_brokers_auto_creating_one_topic_at_once_make_one_topic(
    broker_cluster: LocalCluster,
) -> None:
    for attempt in range(3):  # a few races, each on a fresh topic
        topic = f"raced-{attempt}"
        addresses = [broker_cluster.client_address(b) for b in range(3)]
        replies = _publish_at_once(addresses, f"PUBS {topic} from everyone\r\n".encode())
        assert all(r.startswith(b"+OK ") for r in replies), replies
        with LineClient(broker_cluster.client_address(attempt)) as c:
            assert _listed(c).count(topic) == 1
            rows = c.rows(f"DESCRIBE {topic}")
            partitions = [r for r in rows if isinstance(r, PartitionRow)]
            assert [p.partition for p in partitions] == [0, 1, 2]
            fetched: list[Reply] = []
            for p in range(3):
                fetched += c.rows(f"FETCH {topic} {p} 0 format=text")
        assert [m.value for m in fetched if isinstance(m, MessageRow)] == [b"from everyone"] * 3


def test_auto_create_can_be_turned_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    data_dir = str(tmp_path_factory.mktemp("no-auto"))
    flags = ["--no-auto-create-topics"]
    with (
        LocalCluster(data_dir, 1, extra_args=flags) as cluster,
        LineClient(cluster.client_address(0)) as c,
    ):
        assert _code(c.call("PUBS fresh hello")) is ErrorCode.UNKNOWN_TOPIC
        assert _code(c.call("PUB fresh key=k hello")) is ErrorCode.UNKNOWN_TOPIC
        assert _code(c.call("SUBS fresh g")) is ErrorCode.UNKNOWN_TOPIC
        assert "fresh" not in _listed(c)
        assert c.ok("CREATE fresh 1 1") == "created"
        assert c.ok("PUBS fresh hello").split()[0] == "0"


def test_defaults_come_from_the_flags_and_replicas_are_capped(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data_dir = str(tmp_path_factory.mktemp("defaults"))
    flags = ["--default-partitions", "2", "--default-replication-factor", "3"]
    with (
        LocalCluster(data_dir, 1, extra_args=flags) as cluster,
        LineClient(cluster.client_address(0)) as c,
    ):
        c.ok("PUBS two-partitions hello")
        row = _topic_row(c, "two-partitions")
    assert (row.partitions, row.replication_factor) == (2, 1)  # one broker: one replica


def test_broker_flags_and_settings_of_auto_creation() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    base = ["broker", "--id", "0", "--data-dir", "d", "--client", "127.0.0.1:1"]
    base += ["--peers", "0@127.0.0.1:2", "--controllers", "0@127.0.0.1:3"]
    default = config_of(parser.parse_args(base))
    assert (default.auto_create_topics, default.default_partitions) == (True, 3)
    assert default.default_replication_factor == 3
    flags = ["--no-auto-create-topics", "--default-partitions", "6"]
    flags += ["--default-replication-factor", "2"]
    changed = config_of(parser.parse_args([*base, *flags]))
    assert not changed.auto_create_topics
    assert (changed.default_partitions, changed.default_replication_factor) == (6, 2)
    minimal = {"id": 0, "data_dir": "d", "client": "127.0.0.1:1"}
    minimal |= {"peers": "0@127.0.0.1:2", "controllers": "0@127.0.0.1:3"}
    for bad in ({"default_partitions": 0}, {"default_replication_factor": 0}):
        with pytest.raises(ConfigError):
            config_from_mapping({**minimal, **bad})
