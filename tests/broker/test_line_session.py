"""The line protocol against a real 3-broker cluster: the seed's commands and what logs need.

Each test uses its own topic on the module's cluster (``broker_cluster``), over real TCP.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
import trio
import trio.testing

from kafkaesque.broker._session import Session, Slot, TaskSlot, serve_session
from kafkaesque.client._calls import subscribe
from kafkaesque.fd_stream import FdStream
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    Command,
    DataReply,
    EndReply,
    ErrorCode,
    ErrorReply,
    GroupRow,
    LineLimits,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    Reply,
    partition_for_key,
)
from kafkaesque.storage import BatchType, Record, build_batch, decode_records, iter_batches

from .line_client import LineClient


def messages(rows: list[Reply]) -> list[MessageRow]:
    return [r for r in rows if isinstance(r, MessageRow)]


def test_the_seeds_telnet_session(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(1)) as c:
        assert c.ok("CREATE seed 3 3") == "created"
        published = [c.ok("PUBS seed hello world") for _ in range(3)]
        envelope = json.dumps({"Header": "h", "Key": "124", "Body": "Hello World!"})
        keyed = c.ok(f"PUBS seed {envelope}")
        sub = c.ok("SUBS seed billing")
        rows = c.rows(f"CONS seed {sub} 0")
    # Round-robin without a key: three records, three partitions.
    assert sorted(int(p.split()[0]) for p in published) == [0, 1, 2]
    partition = int(keyed.split()[0])
    assert partition == partition_for_key(b"124", 3)
    got = messages(rows)
    assert sorted(m.value or b"" for m in got) == [b"Hello World!"] + [b"hello world"] * 3
    assert next(m for m in got if m.key == b"124").partition == partition
    end = rows[-1]
    assert isinstance(end, EndReply) and dict(end.next_offsets).keys() == {0, 1, 2}


def test_keyed_publishes_land_in_one_partition_in_order(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE keyed 4 3")
        acks = [c.ok(f"PUB keyed key=device-7 reading-{i}") for i in range(50)]
        partitions = {a.split()[0] for a in acks}
        assert partitions == {str(partition_for_key(b"device-7", 4))}
        offsets = [int(a.split()[1]) for a in acks]
        assert offsets == sorted(offsets) and len(set(offsets)) == 50
        rows = c.rows(f"FETCH keyed {partitions.pop()} 0 format=text")
    assert [m.value for m in messages(rows)] == [f"reading-{i}".encode() for i in range(50)]
    assert [m.offset for m in messages(rows)] == offsets


def test_two_groups_read_the_same_topic_independently(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(2)) as c:
        c.ok("CREATE shared 2 3")
        for i in range(10):
            c.ok(f"PUBS shared m{i}")
        a, b = c.ok("SUBS shared group-a"), c.ok("SUBS shared group-b")
        got_a = messages(c.rows(f"CONS shared {a} 0"))
        got_b = messages(c.rows(f"CONS shared {b} 0"))
        one = c.ok("SUBS shared group-c 1")
        got_one = messages(c.rows(f"CONS shared {one} 0"))
    assert sorted(m.value or b"" for m in got_a) == sorted(f"m{i}".encode() for i in range(10))
    assert got_a == got_b
    assert len({m.partition for m in got_one}) == 1  # the count caps the partitions


def test_any_broker_accepts_writes_and_reads(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE anywhere 1 3")
    acked = []
    for broker in range(3):
        with LineClient(broker_cluster.client_address(broker)) as c:
            acked += [c.ok(f"PUB anywhere partition=0 via-{broker}-{i}") for i in range(5)]
    for broker in range(3):
        with LineClient(broker_cluster.client_address(broker)) as c:
            rows = c.rows("FETCH anywhere 0 0 format=text")
            assert [m.offset for m in messages(rows)] == [int(a.split()[1]) for a in acked]


def test_batch_publish_and_binary_fetch(broker_cluster: LocalCluster) -> None:
    batch = build_batch([Record(value=bytes([i]) * 100, key=b"k%d" % i) for i in range(100)])
    with LineClient(broker_cluster.client_address(1)) as c:
        c.ok("CREATE binary 1 3")
        c.send(b"PUBB binary 0 %d\r\n" % len(batch) + batch + b"\r\n")
        first = c.answer()
        fetched = c.call("FETCH binary 0 0 max_bytes=1000000")
        bad = build_batch([Record(value=b"x")])
        c.send(b"PUBB binary 0 %d\r\n" % len(bad) + bad[:-1] + b"y" + b"\r\n")
        corrupt = c.answer()
    assert first is not None and not isinstance(first, list | ErrorReply)
    assert isinstance(fetched, DataReply)
    records = []
    pos = 0
    for header in iter_batches(fetched.payload):
        if header.batch_type is BatchType.DATA:  # consumers skip Raft's control batches
            records += decode_records(fetched.payload[pos : pos + header.size], header)
        pos += header.size
    assert [r.value for r in records] == [bytes([i]) * 100 for i in range(100)]
    assert isinstance(corrupt, ErrorReply) and corrupt.code is ErrorCode.INVALID_BATCH


def test_commit_and_read_committed_offsets(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE committed 2 3")
        c.ok("COMMIT readers committed 1 42")
    with LineClient(broker_cluster.client_address(2)) as c:
        rows = c.rows("OFFSETS readers committed")
    assert [r for r in rows if isinstance(r, OffsetRow)] == [
        OffsetRow("committed", 0, None),
        OffsetRow("committed", 1, 42),
    ]


def test_delete_then_recreate_starts_empty(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE doomed 1 3")
        c.ok("PUBS doomed old")
        c.ok("DELETE doomed")
        assert _code(c.call("FETCH doomed 0 0")) is ErrorCode.UNKNOWN_TOPIC
        c.ok("CREATE doomed 1 3")
        c.ok("PUBS doomed new")
        rows = c.rows("FETCH doomed 0 0 format=text")
    assert [m.value for m in messages(rows)] == [b"new"]


def test_metadata_names_leaders_and_metrics_show_them(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE watched 3 3")
        c.ok("PUBS watched x")
        rows = c.rows("METADATA watched")
    leaders = {r.leader for r in rows if isinstance(r, PartitionRow)}
    assert leaders == {0, 1, 2}  # leaders spread over the brokers
    url = f"http://127.0.0.1:{broker_cluster.ports[0].admin}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert 'kafkaesque_partition_commit_index{broker="0",partition="0",topic="watched"}' in text
    assert (
        'kafkaesque_partition_corruptions_total{broker="0",partition="0",topic="watched"} 0.0'
        in text
    )
    assert 'kafkaesque_partition_repairing{broker="0",partition="0",topic="watched"} 0.0' in text
    assert (
        'kafkaesque_partition_divergences_total{broker="0",partition="0",topic="watched"} 0.0'
        in text
    )
    assert "kafkaesque_requests_total" in text
    counts = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("kafkaesque_commit_latency_seconds_count", "kafkaesque_fsync"))
    }
    assert counts["kafkaesque_commit_latency_seconds_count"] >= 1
    assert counts["kafkaesque_fsync_latency_seconds_count"] >= 1


def test_describe_gives_the_leaders_end_whichever_broker_answers(
    broker_cluster: LocalCluster,
) -> None:
    # A follower learns the commit index with the leader's next message, so its own end lags
    # the acknowledgement just sent: DESCRIBE asks the leader. (Each answer checked at once.)
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE ends 1 3")
        c.ok("PUB ends partition=0 first")
        row = next(r for r in c.rows("DESCRIBE ends") if isinstance(r, PartitionRow))
    assert row.leader is not None
    follower = next(b for b in row.replicas if b != row.leader)
    with (
        LineClient(broker_cluster.client_address(row.leader)) as leader,
        LineClient(broker_cluster.client_address(follower)) as other,
    ):
        for i in range(2, 22):
            offset = int(leader.ok(f"PUB ends partition=0 m{i}").split()[1])
            described = [r for r in other.rows("DESCRIBE ends") if isinstance(r, PartitionRow)]
            assert [(r.start_offset, r.end_offset) for r in described] == [(0, offset + 1)]


def test_cons_past_the_end_is_out_of_range_as_fetch_says(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE beyond 1 3")
        end = int(c.ok("PUBS beyond only").split()[1]) + 1
        sub = c.ok("SUBS beyond readers")
        at_end = c.rows(f"CONS beyond {sub} {end}")  # valid: nothing there yet
        past = c.call(f"CONS beyond {sub} {end + 1}")
        pairs = c.call(f"CONS beyond {sub} 0:999999999")
        fetched = c.call(f"FETCH beyond 0 {end + 1}")
        below = c.rows(f"CONS beyond {sub} 0")  # still fine: from the log start
    assert at_end == [EndReply(((0, end),))]
    for reply in (past, pairs, fetched):
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.OFFSET_OUT_OF_RANGE
        assert "is outside the log" in reply.message
    assert isinstance(past, ErrorReply) and past.message.startswith(f"beyond/0: offset {end + 1} ")
    assert [m.value for m in messages(below)] == [b"only"]


def test_a_long_polling_cons_reads_every_partition_local_or_not(
    broker_cluster: LocalCluster,
) -> None:
    # Replication factor 1 over three brokers: the coordinator holds a third of the partitions
    # (read in its own task, with a checkpoint every 64) and forwards the reads of the others.
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE wide 70 1")
        for p in range(70):
            c.ok(f"PUB wide partition={p} -- v{p}")
        sub = c.ok("SUBS wide wide-readers")
        rows = c.rows(f"CONS wide {sub} 0 wait_ms=5000")
        end = rows[-1]
        assert isinstance(end, EndReply) and len(end.next_offsets) == 70
        pairs = ",".join(f"{p}:{o}" for p, o in end.next_offsets)
        again = c.rows(f"CONS wide {sub} {pairs} wait_ms=200")
    assert sorted(m.value or b"" for m in messages(rows)) == sorted(
        f"v{p}".encode() for p in range(70)
    )
    assert messages(again) == []


def test_subs_says_how_many_partitions_it_got_when_fewer_than_asked(
    broker_cluster: LocalCluster,
) -> None:
    with LineClient(broker_cluster.client_address(1)) as c:
        c.ok("CREATE capped 2 3")
        c.ok("PUB capped partition=0 zero")
        c.ok("PUB capped partition=1 one")
        first = c.ok("SUBS capped crew 2")  # the whole topic: as asked
        second = c.ok("SUBS capped crew 2")  # two members share two partitions
        greedy = c.ok("SUBS capped others 5")  # the topic has two
        second_id = second.split()[0]
        rows = c.rows(f"CONS capped {second_id} 0")
    assert " " not in first
    assert second.split()[1:] == ["partitions=1", "asked=2"]
    assert greedy.split()[1:] == ["partitions=2", "asked=5"]
    assert len(messages(rows)) == 1  # the id before the note is the subscription


def test_a_subscription_with_a_note_leaves_when_its_connection_closes(
    broker_cluster: LocalCluster,
) -> None:
    # The connection remembers the id, not the note after it: closing it makes the member leave
    # at once, long before the session timeout (10 s) would.
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE noted 2 3")
        c.ok("SUBS noted crew")
        with LineClient(broker_cluster.client_address(2)) as leaving:
            noted = leaving.ok("SUBS noted crew 2")
        member = noted.split()[0]
        assert noted.split()[1:] == ["partitions=1", "asked=2"]
        deadline = time.monotonic() + 5
        while True:
            owners = {r.owner for r in c.rows("GROUPS crew noted") if isinstance(r, GroupRow)}
            if member not in owners or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert member not in owners


def test_the_client_library_reads_the_id_before_the_note() -> None:
    call = subscribe("t", "g", 2)
    assert call.parse(OkReply("0.abc partitions=1 asked=2")) == "0.abc"
    assert call.parse(OkReply("0.abc")) == "0.abc"


def test_cons_with_a_subscription_to_another_topic_says_so(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(2)) as c:
        c.ok("CREATE mine 1 3")
        c.ok("CREATE theirs 1 3")
        sub = c.ok("SUBS mine readers")
        wrong = c.call(f"CONS theirs {sub} 0")
        still = c.rows(f"CONS mine {sub} 0")  # the member did not leave
    assert isinstance(wrong, ErrorReply) and wrong.code is ErrorCode.UNKNOWN_SUBSCRIPTION
    assert f"subscription {sub} is for topic mine, not theirs" in wrong.message
    assert "left" not in wrong.message
    assert isinstance(still[-1], EndReply)


def test_topic_exists_error_shows_values_not_reprs(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.ok("CREATE configured 1 3 retention_ms=60000")
        reply = c.call("CREATE configured 2 3 compact=yes")
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TOPIC_EXISTS
    assert "TopicConfig" not in reply.message and "None" not in reply.message
    assert "exists with partitions=1 replication_factor=3 retention_ms=60000" in reply.message
    assert (
        "not partitions=2 replication_factor=3" in reply.message and "compact=yes" in reply.message
    )


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("FROB x", ErrorCode.UNKNOWN_COMMAND),
        ("PUBS", ErrorCode.BAD_ARGS),
        ("FETCH no-such-topic 0 0", ErrorCode.UNKNOWN_TOPIC),
        ("PUBS bad/name hello", ErrorCode.INVALID_TOPIC),
        ("CREATE __mine 1 1", ErrorCode.INVALID_TOPIC),
        ("CREATE toomany 1 4", ErrorCode.INVALID_CONFIG),
        ("PUB errors partition=9 x", ErrorCode.UNKNOWN_PARTITION),
        ("FETCH errors 0 999", ErrorCode.OFFSET_OUT_OF_RANGE),
        ("CONS errors nope 0", ErrorCode.UNKNOWN_SUBSCRIPTION),
    ],
)
def test_bad_commands_get_clear_errors(
    broker_cluster: LocalCluster, line: str, code: ErrorCode
) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        c.call("CREATE errors 1 3")
        assert _code(c.call(line)) is code
        assert c.ok("PING") == "PONG"  # the session goes on


def _code(reply: Reply | list[Reply]) -> ErrorCode | None:
    return reply.code if isinstance(reply, ErrorReply) else None


# -- who writes a reply (in process, no broker) ----------------------------------------------


async def _session_with_held_replies(
    nursery: trio.Nursery,
) -> tuple[socket.socket, list[TaskSlot]]:
    """A session over an ``FdStream`` whose every command's reply the test sets (``slots``);
    the client's end is a plain non-blocking socket, read without any checkpoint."""
    server_end, client = socket.socketpair()
    client.setblocking(False)
    stream = FdStream(trio.SocketStream(trio.socket.from_stdlib_socket(server_end)))
    slots: list[TaskSlot] = []

    def dispatch(command: Command, nursery: trio.Nursery, session: Session) -> Slot:
        slot = TaskSlot()
        slots.append(slot)
        return slot

    nursery.start_soon(serve_session, stream, dispatch, LineLimits(), 64, lambda session: None)
    return client, slots


def _received(client: socket.socket) -> bytes:
    """What the session wrote so far, read now (no checkpoint: no other task runs)."""
    got = b""
    while True:
        try:
            data = client.recv(1 << 20)
        except BlockingIOError:
            return got
        if not data:
            return got
        got += data


async def test_a_reply_is_written_by_the_task_that_makes_it_ready_in_command_order() -> None:
    # Issue 22: the writer task's pass of the scheduler for each reply cost more than the write.
    async with trio.open_nursery() as nursery:
        client, slots = await _session_with_held_replies(nursery)
        client.sendall(b"PUBS t one\r\nPUBS t two\r\nPUBS t three\r\n")
        await trio.testing.wait_all_tasks_blocked()
        assert len(slots) == 3
        slots[1].set(b"+OK 0 1\r\n")
        assert _received(client) == b""  # the first reply is not ready: the second waits
        slots[0].set(b"+OK 0 0\r\n")  # written from here, before any other task runs
        assert _received(client) == b"+OK 0 0\r\n+OK 0 1\r\n"
        slots[2].set(b"+OK 0 2\r\n")
        assert _received(client) == b"+OK 0 2\r\n"
        client.close()  # the session ends: it owes nothing


async def test_what_a_full_socket_does_not_take_the_writer_sends_in_order() -> None:
    async with trio.open_nursery() as nursery:
        client, slots = await _session_with_held_replies(nursery)
        client.sendall(b"PUBS t one\r\nPUBS t two\r\nPUBS t three\r\n")
        await trio.testing.wait_all_tasks_blocked()
        big = [bytes([65 + k]) * (4 << 20) + b"\r\n" for k in range(2)]
        slots[0].set(big[0])  # more than the socket takes: the rest is kept for the writer
        slots[1].set(big[1])  # the writer has not run yet: this goes after what was kept
        slots[2].set(b"+OK 0 2\r\n")
        got = b""
        with trio.fail_after(10):
            while len(got) < 2 * len(big[0]) + 9:
                await trio.sleep(0.001)  # the writer sends as the client reads
                got += _received(client)
        assert got == big[0] + big[1] + b"+OK 0 2\r\n"
        client.close()
