"""Finding a device's QoS 1 resend in a partition's log, so it is not appended twice.

MQTT QoS 1 is at least once on the wire: a device that got no PUBACK (its broker died, the
connection dropped) publishes again with DUP set, maybe through another broker. If the first copy
had committed, appending the resend would put the message in the log twice. Every QoS 1 record
therefore carries its publisher's client id and packet id (headers ``mqtt.client`` and
``mqtt.pid``); a DUP publish is first looked up by those, with its value, in the recent tail of
its partition, by the partition's leader (``WritePath.find_resend``), and acknowledged with the
first copy's offset when it is there.

The leader answers only after a read-index round (``MultiRaft.read_index``): a new leader has
then committed an entry of its term, so every entry of an earlier term that will ever be
committed is in its log, and none that is missing can appear later. Entries of its own term are
looked up too, committed or not: the caller waits for the found one to commit.

A ``ResendIndex`` belongs to one leader term of one partition (its log only grows in that term)
and reads each record once: before a lookup it indexes what was appended since the last one, a
chunk of the log per ``catch_up`` call, so the caller can let other tasks run in between (the
first lookup after a failover reads up to ``TAIL_RECORDS`` records). It covers the last
``TAIL_RECORDS`` offsets: a resend of something older is appended again (at least once, as MQTT
promises); devices resend within seconds.
"""

from __future__ import annotations

import zlib

from kafkaesque.protocol.mqtt import MQTT_CLIENT_HEADER, MQTT_PACKET_ID_HEADER
from kafkaesque.storage import PartitionLog, data_records

TAIL_RECORDS = 50_000
_READ_BYTES = 1 << 20


def resend_key(client_id: str, packet_id: int) -> tuple[bytes, bytes]:
    """The header values a QoS 1 record of ``client_id``'s packet ``packet_id`` carries."""
    return client_id.encode(), str(packet_id).encode()


def value_digest(value: bytes | None) -> int:
    """What a resend's value is compared by (CRC-32: the packet id and client id match too)."""
    return zlib.crc32(value or b"")


class ResendIndex:
    """(client id, packet id) -> (offset, value digest) of the QoS 1 records in the log's tail."""

    def __init__(self, term: int, tail_records: int = TAIL_RECORDS) -> None:
        self.term = term
        self._tail = tail_records
        self._indexed_to: int | None = None  # offsets below this were read
        self._where: dict[tuple[bytes, bytes], tuple[int, int]] = {}

    def find(self, log: PartitionLog, key: tuple[bytes, bytes], digest: int) -> int | None:
        """The offset of the record ``key`` with value digest ``digest``, if the tail has it
        (the whole tail indexed first: see ``catch_up`` to do that a chunk at a time)."""
        while not self.catch_up(log):
            pass
        hit = self._where.get(key)
        if hit is None or hit[1] != digest:
            return None
        return hit[0]

    def catch_up(self, log: PartitionLog) -> bool:
        """Index one more chunk of the log; True once everything up to its end is indexed."""
        end = log.log_end_offset
        floor = max(log.log_start_offset, end - self._tail)
        offset = floor if self._indexed_to is None else max(self._indexed_to, floor)
        if offset >= end:
            return True
        result = log.read(offset, _READ_BYTES, max_offset=end)
        if not result.data:
            self._indexed_to = end
            return True
        # The log verified them on read.
        for record in data_records(result.data, offset, verify=False):
            self._note(record.offset, record.headers, record.value)
        self._indexed_to = max(result.next_offset, offset + 1)
        if len(self._where) > 2 * self._tail:
            self._where = {k: v for k, v in self._where.items() if v[0] >= floor}
        return self._indexed_to >= end

    def _note(
        self, offset: int, headers: tuple[tuple[str, bytes], ...], value: bytes | None
    ) -> None:
        client = packet = None
        for name, data in headers:
            if name == MQTT_CLIENT_HEADER:
                client = data
            elif name == MQTT_PACKET_ID_HEADER:
                packet = data
        if client is not None and packet is not None:
            self._where[(client, packet)] = (offset, value_digest(value))
