"""Helpers of the MQTT bridge tests: run a bridge in the test's nursery, publish with
``mosquitto_pub``, subscribe with ``mosquitto_sub``, read a log topic back."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    ConsumerRecord,
    KafkaesqueError,
    OffsetReset,
)
from kafkaesque.mqtt_bridge import BridgeConfig, MqttBridge
from kafkaesque.protocol.mqtt import MqttClientOptions
from tests.mosquitto import Mosquitto


def mqtt_options(server: Mosquitto, client_id: str, **overrides: object) -> MqttClientOptions:
    return MqttClientOptions(server.host, server.port, client_id, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def running_bridge(config: BridgeConfig) -> AsyncIterator[MqttBridge]:
    """A bridge running (subscribed) for the body; stopped cleanly after it."""
    bridge = MqttBridge(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        try:
            yield bridge
        finally:
            bridge.stop()
            nursery.cancel_scope.deadline = trio.current_time() + 20


async def publish(
    server: Mosquitto, topic: str, *messages: bytes, qos: int = 1, v5: Sequence[str] = ()
) -> None:
    """Publish ``messages`` in order over one ``mosquitto_pub`` connection (one per line, so no
    newline inside a message) and wait until the server has acknowledged them. ``v5``: more
    arguments that make it an MQTT 5 client (``-D publish <property> <value>...``)."""
    args = ["mosquitto_pub", "-h", server.host, "-p", str(server.port), "-q", str(qos), "-t", topic]
    if v5:
        args += ["-V", "mqttv5", *v5]
    if len(messages) == 1:
        await trio.run_process([*args, "-s"], stdin=messages[0])
    else:
        await trio.run_process([*args, "-l"], stdin=b"".join(m + b"\n" for m in messages))


async def read_topic(
    bootstrap: str, topic: str, count: int, timeout: float = 30.0
) -> list[ConsumerRecord]:
    """The first ``count`` records of ``topic`` (all partitions), waiting up to ``timeout``;
    then a short extra wait to catch records beyond ``count`` (duplicates)."""
    async with AsyncClient(bootstrap) as client:
        with trio.fail_after(timeout):
            while True:
                try:
                    await client.partitions_for(topic)
                    break
                except KafkaesqueError:  # the bridge creates the topic on first use
                    await trio.sleep(0.1)
        consumer = AsyncConsumer(client, auto_offset_reset=OffsetReset.EARLIEST)
        await consumer.assign_topic(topic)
        records: list[ConsumerRecord] = []
        with trio.fail_after(timeout):
            while len(records) < count:
                records.extend(await consumer.poll(0.5))
        records.extend(await consumer.poll(0.5))
        return records


class Subscriber:
    """A ``mosquitto_sub`` run with ``-d`` (see ``subscribed``): its output read line by line."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._process = process
        self._buffer = b""

    async def _line(self) -> str | None:
        """Its next line of output; None at the end of it."""
        while b"\n" not in self._buffer:
            data = await self._stdout.receive_some()
            if not data:
                line, self._buffer = self._buffer, b""
                return line.decode(errors="replace") if line else None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    async def wait_subscribed(self) -> None:
        """Until its SUBACK came (``-d`` prints ``Subscribed (mid: 1): ...`` then)."""
        while (line := await self._line()) is not None:
            if line.startswith("Subscribed ("):
                return
        raise AssertionError("mosquitto_sub ended before its SUBACK came")

    async def messages(self) -> list[str]:
        """The lines of the messages it printed (as ``-v`` or ``-F`` make them; no debug
        lines), once it has exited (its ``-C`` count reached, or its ``-W`` timeout)."""
        lines = []
        while (line := await self._line()) is not None:
            if not line.startswith(("Client ", "Subscribed (")):
                lines.append(line)
        await self._process.wait()
        return lines


@asynccontextmanager
async def subscribed(
    server: Mosquitto, *args: str, count: int, timeout_s: int = 30
) -> AsyncIterator[Subscriber]:
    """``mosquitto_sub`` on ``server`` with ``args`` (``-t``, ``-q``, ``-v``...), until ``count``
    messages came or ``timeout_s`` passed; entered once its subscription is granted (its SUBACK
    came), so that every message published from then on reaches it. Killed on exit."""
    # Line-buffered (stdbuf): into a pipe, its lines would wait in a buffer until it exits.
    argv = ["stdbuf", "-oL", "mosquitto_sub", "-h", server.host, "-p", str(server.port), "-d",
            "-C", str(count), "-W", str(timeout_s), *args]  # fmt: skip
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    assert process.stdout is not None
    subscriber_output = process.stdout
    try:
        subscriber = Subscriber(process)
        with trio.fail_after(timeout_s):
            await subscriber.wait_subscribed()
        yield subscriber
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            await subscriber_output.aclose()


def unread_bytes(port: int) -> int:
    """The bytes that reached the accepted TCP connections of the local server on ``port`` and
    that it has not read yet (their receive queues, from Linux's /proc/net/tcp and tcp6)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                total += int(queues.split(":")[1], 16)
    return total
