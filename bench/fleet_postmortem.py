"""Where the suspect readings of a kept ``bench.fleet`` run are in each broker's log (issue 38).

    python -m bench.fleet_postmortem <kept scratch directory> [--limit N]

``bench.fleet --keep`` leaves the brokers' data and logs, and ``fleet-suspects.json``: every
reading acknowledged but missing from the log read back (``lost``) and every one read back twice
(``duplicated``), with its device and ``readings`` partition. This reads the segment files of
that partition on every broker, read-only (no lock taken, no recovery: the evidence is left as
it is), and prints each suspect with every copy of it found: the broker, offset, Raft term,
producer id and base sequence of its batch, the batch's record count, and the record's
``mqtt.client`` / ``mqtt.pid`` headers. A lost reading found on some broker's disk points at the
read path (or a replica's divergence); found nowhere, at the write path. Two copies under
different producer ids were appended twice; two in one batch's place on different brokers are
one copy, replicated.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

from kafkaesque.cli.devices_report import parse_reading

from kafkaesque.protocol.mqtt import MQTT_CLIENT_HEADER, MQTT_PACKET_ID_HEADER
from kafkaesque.storage import BatchType, InvalidBatchError, decode_records, iter_batches

from .fleet import SUSPECTS_FILE

TOPIC = "readings"


class Copy(NamedTuple):
    """One copy of a reading in one broker's log."""

    broker: int
    partition: int
    offset: int
    term: int
    producer_id: int
    base_sequence: int
    batch_records: int
    client: str | None
    packet_id: str | None


def copies_in(
    partition_dir: Path, broker: int, partition: int, wanted: set[tuple[str, int]]
) -> tuple[dict[tuple[str, int], list[Copy]], str | None]:
    """The copies of the ``wanted`` (device, serial) readings in one partition directory's
    segment files, and why the walk stopped early (a torn or corrupt batch), if it did."""
    found: dict[tuple[str, int], list[Copy]] = defaultdict(list)
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        try:
            for header in iter_batches(data, verify=False):
                batch = data[pos : pos + header.size]
                pos += header.size
                if header.batch_type is not BatchType.DATA:
                    continue
                for record in decode_records(batch, header):
                    reading = parse_reading(record.value or b"")
                    if reading is None or (reading[1], reading[2]) not in wanted:
                        continue
                    headers = dict(record.headers)
                    client, packet = (
                        headers.get(MQTT_CLIENT_HEADER),
                        headers.get(MQTT_PACKET_ID_HEADER),
                    )
                    found[(reading[1], reading[2])].append(
                        Copy(
                            broker,
                            partition,
                            record.offset,
                            header.term,
                            header.producer_id,
                            header.base_sequence,
                            header.record_count,
                            None if client is None else client.decode(errors="replace"),
                            None if packet is None else packet.decode(errors="replace"),
                        )
                    )
        except InvalidBatchError as exc:  # a torn tail (the killed broker's), say
            return found, f"{segment} at byte {pos}: {exc}"
    return found, None


def locate(root: Path) -> dict[str, Any]:
    """The suspects of the run kept in ``root``, each with its copies on every broker."""
    suspects: dict[str, Any] = json.loads((root / SUSPECTS_FILE).read_text())
    entries = suspects["lost"] + suspects["duplicated"]
    wanted = {(e["device"], e["serial"]) for e in entries}
    copies: dict[tuple[str, int], list[Copy]] = defaultdict(list)
    stops: list[str] = []
    for partition in sorted({e["partition"] for e in entries}):
        for broker_dir in sorted((root / "cluster").iterdir()):
            if not broker_dir.name.isdigit():
                continue
            directory = broker_dir / TOPIC / str(partition)
            if not directory.is_dir():
                continue
            found, stop = copies_in(directory, int(broker_dir.name), partition, wanted)
            for key, more in found.items():
                copies[key].extend(more)
            if stop is not None:
                stops.append(stop)
    for kind in ("lost", "duplicated"):
        for entry in suspects[kind]:
            entry["copies"] = [
                c._asdict() for c in copies.get((entry["device"], entry["serial"]), [])
            ]
    suspects["stopped_early"] = stops
    return suspects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_postmortem", description=__doc__)
    parser.add_argument("root", type=Path, help="the kept scratch directory of a bench.fleet run")
    parser.add_argument("--limit", type=int, default=20, help="suspects shown per kind (20)")
    args = parser.parse_args(argv)
    found = locate(args.root)
    print(f"killed at {found['killed_at']:.3f} (wall clock)")
    for stop in found["stopped_early"]:
        print(f"read stopped early: {stop}")
    for kind in ("lost", "duplicated"):
        print(f"{kind}: {len(found[kind])}")
        for entry in found[kind][: args.limit]:
            copies = entry.pop("copies")
            print(f"  {entry}")
            for copy in copies:
                print(f"      {copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
