"""What a Kafka Produce and Fetch cost the broker's CPU against a native append, per record
(issue 33).

    python -m bench.kafka_codec [--quick] [--profile]

One process, no sockets: the part of a Produce that differs between the two protocols. A
librdkafka-like record set (one uncompressed RecordBatch v2 of 256 KiB: null keys, 100-byte
values, timestamps a few milliseconds apart, no producer id, as ``bench.kafka_clients``'s
flat-out producer sends) goes through ``produced_batches`` (CRC-32C check, record walk, the
batch stored verbatim as a version-2 batch: what ``KafkaHandlers`` does before the write path);
the same records, built as our batch by our own client (``build_batch``, client side), go
through what the leader does with a native batch before the write path (``decode_header`` with
both CRCs checked, then ``stamped_prefix``). The write path after both is the same.

The same records then measure the storage choice (docs/storage-format.md, "Which records are
Kafka's, and why not all"): what a Kafka Fetch costs to write a stored batch out as Kafka's, a
Kafka producer's (version 2, ``fetch_verbatim_us_per_record``) and our own producers'
(version 1, translated: ``fetch_us_per_record``); what one of our readers (CONS, MQTT delivery,
compaction, LATEST) pays to walk a version-1 batch's records (``raw_records``:
``v1_read_us_per_record``) against a version-2 one's (``v2_read_us_per_record``); and what our
client pays to build our batch (``build_batch``: ``v1_build_us_per_record``) against Kafka's
(``encode_batch``: ``v2_build_us_per_record``).

``--profile`` prints cProfile's call counts and times of one Kafka record set. Ends with
``RESULT kafka_us_per_record=… native_us_per_record=… kafka_us_per_batch=…
native_us_per_batch=… records_per_batch=… fetch_us_per_record=…
fetch_verbatim_us_per_record=… v1_read_us_per_record=… v2_read_us_per_record=…
v1_build_us_per_record=… v2_build_us_per_record=…``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable

from kafkaesque.broker import kafka_record_set as fetched_record_set
from kafkaesque.broker import produced_batches
from kafkaesque.protocol.kafka import (
    KafkaRecord,
    decode_batch,
    encode_batch,
    iter_batch_bytes,
)
from kafkaesque.storage import (
    Record,
    build_batch,
    decode_header,
    raw_records,
    stamp,
    stamped_prefix,
)

BATCH_BYTES = 256 * 1024
VALUE_BYTES = 100
BASE_TS = 1_764_000_000_000


def kafka_record_set(batch_bytes: int = BATCH_BYTES) -> bytes:
    """One librdkafka-like batch of about ``batch_bytes``: null keys, 100-byte values, no
    headers, timestamps 0-4 ms after the first."""
    count = batch_bytes // (VALUE_BYTES + 9)
    return encode_batch(0, kafka_records(count), last_offset_delta=count - 1)


def kafka_records(count: int) -> list[KafkaRecord]:
    """``count`` librdkafka-like records (``kafka_record_set``'s)."""
    value = bytes(i % 251 for i in range(VALUE_BYTES))
    return [KafkaRecord(i, BASE_TS + i * 5 // count, None, value) for i in range(count)]


def native_batch(record_set: bytes) -> bytes:
    """The same records as our client builds them (version 1)."""
    return build_batch(
        [
            Record(r.value, r.key, (), r.timestamp)
            for batch in iter_batch_bytes(record_set)
            for r in decode_batch(batch).records
        ]
    )


def stored_batch(record_set: bytes) -> bytes:
    """The record set as a Kafka Produce stores it (version 2), stamped as a leader does."""
    (batch,) = produced_batches(record_set)
    return stamp(batch.data, base_offset=1000, term=3)


def _best(run: Callable[[], object], rounds: int) -> float:
    """The least CPU time of ``rounds`` runs, in seconds (CPU time, not wall time: the machine
    is shared; the least: the run least disturbed by caches and collections)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka_codec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--profile", action="store_true", help="cProfile one Kafka record set")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else 30
    record_set = kafka_record_set()
    ours = native_batch(record_set)
    count = decode_header(ours).record_count

    def native() -> None:
        header = decode_header(ours, header_crc=False)
        stamped_prefix(ours, base_offset=header.base_offset + 1, term=1)

    kafka_s = _best(lambda: produced_batches(record_set), rounds)
    native_s = _best(native, rounds)
    client_s = _best(lambda: build_batch([Record(b"x" * VALUE_BYTES)] * count), rounds)
    ours_header = decode_header(ours)
    stored = stored_batch(record_set)
    stored_header = decode_header(stored)
    fetch_s = _best(lambda: fetched_record_set(ours), rounds)
    verbatim_s = _best(lambda: fetched_record_set(stored), rounds)
    v1_read_s = _best(lambda: raw_records(ours, ours_header), rounds)
    v2_read_s = _best(lambda: raw_records(stored, stored_header), rounds)
    value = bytes(i % 251 for i in range(VALUE_BYTES))
    v1_build_s = _best(
        lambda: build_batch([Record(value, timestamp=BASE_TS + i) for i in range(count)]),
        rounds,
    )
    records = kafka_records(count)
    v2_build_s = _best(lambda: encode_batch(0, records, last_offset_delta=count - 1), rounds)

    def per_record(seconds: float) -> str:
        return f"{seconds / count * 1e6:.3f}"

    print(
        f"one record set of {len(record_set):,} bytes, {count:,} records: Kafka "
        f"{kafka_s * 1e3:.2f} ms ({kafka_s / count * 1e6:.3f} us a record), native "
        f"{native_s * 1e3:.3f} ms ({native_s / count * 1e6:.4f} us a record); for scale, our "
        f"client builds that batch in {client_s * 1e3:.2f} ms"
    )
    print(
        f"the storage choice, us a record: a Fetch writing a Kafka producer's batch "
        f"{per_record(verbatim_s)}, our producers' batch as Kafka's {per_record(fetch_s)}; "
        f"a reader walking our records {per_record(v1_read_s)}, "
        f"Kafka's {per_record(v2_read_s)}; our client building our batch "
        f"{per_record(v1_build_s)}, Kafka's {per_record(v2_build_s)}"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(produced_batches, record_set)
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(12)
    print(
        f"RESULT kafka_us_per_record={kafka_s / count * 1e6:.3f} "
        f"native_us_per_record={native_s / count * 1e6:.4f} "
        f"kafka_us_per_batch={kafka_s * 1e6:.0f} native_us_per_batch={native_s * 1e6:.0f} "
        f"records_per_batch={count} fetch_us_per_record={per_record(fetch_s)} "
        f"fetch_verbatim_us_per_record={per_record(verbatim_s)} "
        f"v1_read_us_per_record={per_record(v1_read_s)} "
        f"v2_read_us_per_record={per_record(v2_read_s)} "
        f"v1_build_us_per_record={per_record(v1_build_s)} "
        f"v2_build_us_per_record={per_record(v2_build_s)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
