"""bench.fleet_postmortem: finding a kept run's suspect readings in the brokers' segment files
(real logs written by the storage layer, read back raw)."""

from __future__ import annotations

import json
from pathlib import Path

from kafkaesque.cli.devices_core import reading_payload

from bench.fleet import SUSPECTS_FILE
from bench.fleet_postmortem import locate
from kafkaesque.protocol.mqtt import MQTT_CLIENT_HEADER, MQTT_PACKET_ID_HEADER
from kafkaesque.storage import PartitionLog, Record, build_batch

DEVICE = "phone-00001"


def _reading(serial: int) -> Record:
    value = reading_payload("r1", DEVICE, serial, 1_700_000_000_000, [-50.0])
    headers = ((MQTT_CLIENT_HEADER, DEVICE.encode()), (MQTT_PACKET_ID_HEADER, b"%d" % serial))
    return Record(value=value, key=DEVICE.encode(), headers=headers)


def _write(root: Path, broker: int, batches: list[tuple[int, list[Record]]]) -> None:
    log = PartitionLog.open(str(root / "cluster" / str(broker) / "readings" / "2"))
    try:
        for producer_id, records in batches:
            log.append(build_batch(records, producer_id=producer_id, base_sequence=0), term=1)
    finally:
        log.close()


def test_each_suspect_is_shown_with_every_copy_on_every_broker(tmp_path: Path) -> None:
    # Serial 3 twice on broker 0 (two producer ids: appended twice) and once on broker 1;
    # serial 5, reported lost, on no broker; serial 4 is no suspect and not reported.
    _write(tmp_path, 0, [(11, [_reading(3), _reading(4)]), (12, [_reading(3)])])
    _write(tmp_path, 1, [(11, [_reading(3), _reading(4)])])
    suspect = {"first_broker": 1, "partition": 2, "dropped_at": None, "back_at": None}
    (tmp_path / SUSPECTS_FILE).write_text(
        json.dumps(
            {
                "killed_at": 1.0,
                "lost": [{"device": DEVICE, "serial": 5, **suspect}],
                "duplicated": [{"device": DEVICE, "serial": 3, "copies": 2, **suspect}],
            }
        )
    )
    found = locate(tmp_path)
    assert found["lost"][0]["copies"] == []
    copies = found["duplicated"][0]["copies"]
    assert [(c["broker"], c["offset"], c["producer_id"]) for c in copies] == [
        (0, 0, 11),
        (0, 2, 12),
        (1, 0, 11),
    ]
    assert {(c["client"], c["packet_id"], c["batch_records"]) for c in copies} == {
        (DEVICE, "3", 2),
        (DEVICE, "3", 1),
    }
    assert found["stopped_early"] == []
