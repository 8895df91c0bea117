"""ResendIndex: a device's QoS 1 resend is found in the log's tail by client id, packet id and
value, and nothing else is taken for it."""

from __future__ import annotations

from pathlib import Path

from kafkaesque.broker._resends import ResendIndex, resend_key, value_digest
from kafkaesque.protocol.mqtt import MQTT_CLIENT_HEADER, MQTT_PACKET_ID_HEADER
from kafkaesque.storage import PartitionLog, Record, build_batch


def qos1(client: str, packet_id: int, value: bytes) -> Record:
    c, p = resend_key(client, packet_id)
    return Record(value=value, headers=((MQTT_CLIENT_HEADER, c), (MQTT_PACKET_ID_HEADER, p)))


def append(log: PartitionLog, *records: Record) -> int:
    """Append ``records`` as one batch; the offset of the first."""
    return log.append(build_batch(list(records)), term=1).base_offset


def test_a_resend_is_found_at_its_first_copys_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    append(log, Record(value=b"no headers"))
    at = append(log, qos1("phone-1", 7, b"reading 1"), qos1("phone-2", 7, b"reading 2"))
    index = ResendIndex(term=1)
    assert index.find(log, resend_key("phone-1", 7), value_digest(b"reading 1")) == at
    assert index.find(log, resend_key("phone-2", 7), value_digest(b"reading 2")) == at + 1


def test_another_value_or_client_or_packet_is_not_a_resend(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    append(log, qos1("phone-1", 7, b"reading 1"))
    index = ResendIndex(term=1)
    assert index.find(log, resend_key("phone-1", 7), value_digest(b"reading 2")) is None
    assert index.find(log, resend_key("phone-1", 8), value_digest(b"reading 1")) is None
    assert index.find(log, resend_key("phone-9", 7), value_digest(b"reading 1")) is None


def test_records_appended_after_a_lookup_are_found_by_the_next(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    index = ResendIndex(term=1)
    assert index.find(log, resend_key("phone-1", 1), value_digest(b"a")) is None
    at = append(log, qos1("phone-1", 1, b"a"))
    assert index.find(log, resend_key("phone-1", 1), value_digest(b"a")) == at


def test_a_reused_packet_id_finds_its_latest_message(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    append(log, qos1("phone-1", 1, b"old"))
    at = append(log, qos1("phone-1", 1, b"new"))
    index = ResendIndex(term=1)
    assert index.find(log, resend_key("phone-1", 1), value_digest(b"new")) == at
    assert index.find(log, resend_key("phone-1", 1), value_digest(b"old")) is None


def test_only_the_tail_is_searched(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    append(log, qos1("phone-1", 1, b"long ago"))
    for i in range(10):
        append(log, qos1("phone-2", i + 1, b"later"))
    index = ResendIndex(term=1, tail_records=5)
    assert index.find(log, resend_key("phone-1", 1), value_digest(b"long ago")) is None
    assert index.find(log, resend_key("phone-2", 10), value_digest(b"later")) == 10


def test_catching_up_goes_a_chunk_at_a_time_and_finds_the_same(tmp_path: Path) -> None:
    log = PartitionLog.open(str(tmp_path))
    for batch in range(3):  # about 1.3 MB: more than one chunk
        append(log, *(qos1(f"phone-{batch}", i + 1, b"x" * 100) for i in range(4000)))
    index = ResendIndex(term=1)
    steps = 1
    while not index.catch_up(log):
        steps += 1
    assert steps > 1
    assert index.find(log, resend_key("phone-2", 4000), value_digest(b"x" * 100)) == 11999
