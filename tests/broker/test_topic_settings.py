"""Topic settings that change after creation (ALTER) and the fsync policy, without processes.

The metadata's ``alter_topic`` (more partitions, retention, compaction; idempotent; refusals),
the broker's ``--fsync`` settings, and how both reach the partition logs a broker opens.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import trio

from kafkaesque.broker import ConfigError, config_from_mapping
from kafkaesque.broker._broker import Broker
from kafkaesque.broker._metadata_state import MetadataState
from kafkaesque.broker._metadata_view import (
    BrokerInfo,
    InvalidConfigError,
    TopicConfig,
    TopicInfo,
    UnknownTopicError,
    assign_replicas,
)
from kafkaesque.storage import FsyncPolicy, Record, build_batch

BASE = {
    "id": 1,
    "data_dir": "data",
    "client": "127.0.0.1:9102",
    "peers": "1@127.0.0.1:9103",
    "controllers": "1@127.0.0.1:9104",
}


def _state(brokers: int = 3) -> MetadataState:
    state = MetadataState()
    for i in range(brokers):
        state.register_broker(BrokerInfo(i, "127.0.0.1", 9000 + i, 9100 + i, 9200 + i))
    return state


def _created(state: MetadataState, name: str, config: TopicConfig) -> TopicInfo:
    info = state.create_topic(name, config)
    assert isinstance(info, TopicInfo), info
    return info


# --- The metadata's alter_topic ----------------------------------------------------------------


def test_adding_partitions_keeps_the_old_ones_and_places_the_new_as_create_would() -> None:
    state = _state()
    before = _created(state, "orders", TopicConfig(3, 2, retention_ms=1000))
    version = state.version
    after = state.alter_topic("orders", {"partitions": 5})
    assert isinstance(after, TopicInfo)
    assert after.config == TopicConfig(5, 2, retention_ms=1000)
    assert after.replicas[:3] == before.replicas  # nothing moves
    assert after.replicas == assign_replicas("orders", 5, 2, state.brokers)
    assert state.version == version + 1 and state.topics["orders"] == after


def test_alter_is_idempotent_and_refuses_fewer_partitions() -> None:
    state = _state()
    _created(state, "t", TopicConfig(4, 3))
    grown = state.alter_topic("t", {"partitions": 6})
    version = state.version
    assert state.alter_topic("t", {"partitions": 6}) == grown  # a resend changes nothing
    assert state.version == version
    refused = state.alter_topic("t", {"partitions": 2})
    assert isinstance(refused, InvalidConfigError)
    assert "6 partitions: they can be added, not removed (2 asked)" in str(refused)
    assert state.topics["t"] == grown and state.version == version


def test_retention_and_compaction_change_in_place() -> None:
    state = _state()
    before = _created(state, "t", TopicConfig(2, 3, retention_ms=10, fsync="never"))
    after = state.alter_topic("t", {"retention_ms": None, "retention_bytes": 4096, "compact": True})
    assert isinstance(after, TopicInfo)
    assert after.config == TopicConfig(2, 3, None, 4096, True, "never")
    assert after.replicas == before.replicas


@pytest.mark.parametrize(
    ("name", "changes", "error", "message"),
    [
        ("nope", {"partitions": 4}, UnknownTopicError, "no topic 'nope'"),
        ("t", {"replication_factor": 1}, InvalidConfigError, "cannot alter replication_factor"),
        ("t", {"fsync": "never"}, InvalidConfigError, "cannot alter fsync"),
        ("t", {"retention_ms": 0}, InvalidConfigError, "retention_ms must be >= 1"),
        ("t", {"partitions": 0}, InvalidConfigError, "can be added, not removed"),
    ],
)
def test_bad_alters_change_nothing(
    name: str, changes: dict[str, object], error: type[Exception], message: str
) -> None:
    state = _state()
    info = _created(state, "t", TopicConfig(2, 3))
    version = state.version
    refused = state.alter_topic(name, changes)
    assert isinstance(refused, error) and message in str(refused)
    assert state.topics["t"] == info and state.version == version


def test_new_partitions_need_enough_brokers_registered() -> None:
    state = _state(3)
    _created(state, "t", TopicConfig(1, 3))
    del state.brokers[2]  # as if the registry had shrunk since the creation
    refused = state.alter_topic("t", {"partitions": 2})
    assert isinstance(refused, InvalidConfigError) and "2 registered brokers" in str(refused)
    # Changing retention alone places nothing, so it does not need them.
    assert isinstance(state.alter_topic("t", {"retention_bytes": 10}), TopicInfo)


def test_the_fsync_setting_is_checked_and_survives_a_dump() -> None:
    state = _state()
    refused = state.create_topic("t", TopicConfig(1, 1, fsync="sometimes"))
    assert isinstance(refused, InvalidConfigError) and "fsync must be one of" in str(refused)
    _created(state, "t", TopicConfig(1, 1, fsync="interval"))
    state.alter_topic("t", {"partitions": 2})
    again = MetadataState.from_primitive(state.to_primitive())
    assert again.topics == state.topics and again.version == state.version


def test_an_old_journal_topic_reads_with_the_brokers_fsync() -> None:
    # Entries and dumps written before the fsync field hold five config fields.
    assert TopicConfig(*(3, 3, None, None, False)).fsync is None


# --- The broker's settings ----------------------------------------------------------------------


def test_the_broker_fsyncs_always_unless_told_otherwise() -> None:
    config = config_from_mapping(BASE)
    assert (config.fsync, config.fsync_interval_ms) == ("always", 1000)
    config = config_from_mapping({**BASE, "fsync": "interval", "fsync_interval_ms": 50})
    assert (config.fsync, config.fsync_interval_ms) == ("interval", 50)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fsync": "sometimes"}, "fsync must be one of always, interval, never, not 'sometimes'"),
        ({"fsync_interval_ms": 0}, "fsync_interval_ms must be a whole number"),
        ({"fsync_interval_ms": "1s"}, "fsync_interval_ms must be a whole number"),
    ],
)
def test_bad_fsync_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_mapping({**BASE, **change})


def _broker_flags(*flags: str) -> argparse.Namespace:
    from kafkaesque.cli.main import build_parser

    base = ["broker", "--id", "1", "--data-dir", "d", "--client", "127.0.0.1:9102"]
    base += ["--peers", "1@127.0.0.1:9103", "--controllers", "1@127.0.0.1:9104"]
    parsed: argparse.Namespace = build_parser(["broker"]).parse_args([*base, *flags])
    return parsed


def test_the_fsync_flags_become_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from kafkaesque.cli.broker import config_of

    config = config_of(_broker_flags("--fsync", "never", "--fsync-interval-ms", "250"))
    assert (config.fsync, config.fsync_interval_ms) == ("never", 250)
    with pytest.raises(SystemExit):
        _broker_flags("--fsync", "sometimes")
    assert "--fsync: invalid choice: 'sometimes'" in capsys.readouterr().err


# --- What a broker's partition logs get -------------------------------------------------------


def _broker(tmp_path: Path, **settings: object) -> Broker:
    return Broker(config_from_mapping({**BASE, "data_dir": str(tmp_path), **settings}))


def _info(name: str, config: TopicConfig) -> TopicInfo:
    return TopicInfo(name, config, tuple((1,) for _ in range(config.partitions)))


def test_the_fsync_policy_reaches_the_partition_logs(tmp_path: Path) -> None:
    async def main() -> None:
        broker = _broker(tmp_path, fsync="interval", fsync_interval_ms=75)
        try:
            broker.hosting.host(_info("plain", TopicConfig(1, 1)), 0, (1,))
            broker.hosting.host(_info("strict", TopicConfig(1, 1, fsync="always")), 0, (1,))
            broker.hosting.host(_info("lax", TopicConfig(1, 1, fsync="never")), 0, (1,))
            plain = broker.reads.local_replica("plain", 0)
            strict = broker.reads.local_replica("strict", 0)
            lax = broker.reads.local_replica("lax", 0)
            assert plain is not None and strict is not None and lax is not None
            assert plain.log.config.fsync is FsyncPolicy.INTERVAL  # the broker's
            assert plain.log.config.fsync_interval_ms == 75
            assert strict.log.config.fsync is FsyncPolicy.ALWAYS  # the topic's wins
            assert lax.log.config.fsync is FsyncPolicy.NEVER
        finally:
            broker.raft.close()

    trio.run(main)


def test_an_open_log_takes_a_new_retention_without_reopening(tmp_path: Path) -> None:
    async def main() -> None:
        broker = _broker(tmp_path, fsync="never")
        try:
            config = TopicConfig(1, 1, retention_ms=1000)
            broker.hosting.host(_info("t", config), 0, (1,))
            group = broker.reads.local_replica("t", 0)
            assert group is not None
            log_before = group.log
            altered = TopicConfig(1, 1, retention_ms=None, retention_bytes=8192, compact=True)
            broker.hosting.host(_info("t", altered), 0, (1,))
            assert broker.reads.local_replica("t", 0) is group and group.log is log_before
            assert (group.log.config.retention_ms, group.log.config.retention_bytes) == (
                None,
                8192,
            )
            # Compacted topics roll small segments; the fsync policy stays the broker's.
            assert group.log.config.segment_bytes < broker.config.segment_bytes
            assert group.log.config.fsync is FsyncPolicy.NEVER
        finally:
            broker.raft.close()

    trio.run(main)


def _append(group: Any, n: int) -> None:
    """Append ``n`` one-record batches to ``group``'s log directly (no Raft: the broker does
    not run here; what is looked at is only the log's flushed end)."""
    for i in range(n):
        group.log.append(build_batch([Record(b"v%d" % i)]), term=1)


def test_an_interval_log_left_idle_is_flushed_within_its_interval(tmp_path: Path) -> None:
    async def main() -> None:
        broker = _broker(tmp_path, fsync="interval", fsync_interval_ms=40)
        try:
            broker.hosting.host(_info("lazy", TopicConfig(1, 1)), 0, (1,))
            broker.hosting.host(_info("off", TopicConfig(1, 1, fsync="never")), 0, (1,))
            lazy, off = broker.reads.local_replica("lazy", 0), broker.reads.local_replica("off", 0)
            assert lazy is not None and off is not None
            _append(lazy, 3)
            _append(off, 3)
            assert lazy.log.flushed_end_offset < lazy.log.log_end_offset  # in the page cache
            async with trio.open_nursery() as nursery:
                nursery.start_soon(broker.hosting.interval_flush_loop)
                with trio.fail_after(10):  # a generous bound: the interval is 40 ms
                    while lazy.log.flushed_end_offset < lazy.log.log_end_offset:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            # "never" leaves it to the operating system.
            assert off.log.flushed_end_offset < off.log.log_end_offset
        finally:
            broker.raft.close()

    trio.run(main)
