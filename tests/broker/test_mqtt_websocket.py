"""MQTT over WebSocket (``--mqtt-ws-listen``): the stream adapter against a wsproto client on
trio memory streams, then real paho clients against a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    RejectConnection,
    Request,
    TextMessage,
)

from kafkaesque.broker.mqtt._websocket import WebSocketStream
from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster, free_ports

from .mqtt_helpers import RULES, PahoDevice, assert_round_trip, wait_for

# -- the adapter ----------------------------------------------------------------------------------


class _Browser:
    """The client side of a WebSocket on one end of a memory stream pair."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def events(self) -> list[Event]:
        data = await self.stream.receive_some()
        self.ws.receive_data(bytes(data) or None)
        return list(self.ws.events())


async def _opened(subprotocols: list[str]) -> tuple[_Browser, WebSocketStream]:
    client_end, server_end = trio.testing.memory_stream_pair()
    browser, server = _Browser(client_end), WebSocketStream(server_end)
    await browser.send(Request(host="broker", target="/mqtt", subprotocols=subprotocols))
    return browser, server


async def _receive(server: WebSocketStream, into: list[bytes | Exception]) -> None:
    try:
        into.append(await server.receive_some())
    except trio.BrokenResourceError as exc:
        into.append(exc)


async def test_mqtt_bytes_travel_in_binary_messages_split_and_joined_as_sent() -> None:
    browser, server = await _opened(["mqtt"])
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            while len(b"".join(got)) < 6:
                got.append(await server.receive_some())

        nursery.start_soon(read)
        (accepted,) = await browser.events()
        assert isinstance(accepted, AcceptConnection) and accepted.subprotocol == "mqtt"
        await browser.send(BytesMessage(b"\x10\x04"))  # a packet split over two messages
        await browser.send(BytesMessage(b"abcd"))
    assert b"".join(got) == b"\x10\x04abcd"
    await server.send_all(b"\x20\x02\x00\x00")
    (message,) = await browser.events()
    assert isinstance(message, BytesMessage) and message.data == b"\x20\x02\x00\x00"


async def test_a_client_that_does_not_offer_mqtt_is_refused() -> None:
    browser, server = await _opened(["chat"])
    got: list[bytes | Exception] = []
    await _receive(server, got)
    assert isinstance(got[0], trio.BrokenResourceError) and "mqtt" in str(got[0])
    refused = (await browser.events())[0]
    assert isinstance(refused, RejectConnection) and refused.status_code == 400


async def test_a_text_message_closes_the_connection() -> None:
    browser, server = await _opened(["mqtt"])
    got: list[bytes | Exception] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_receive, server, got)
        assert isinstance((await browser.events())[0], AcceptConnection)
        await browser.send(TextMessage("hello"))
    assert isinstance(got[0], trio.BrokenResourceError) and "MQTT-6.0.0-1" in str(got[0])
    (closed,) = await browser.events()
    assert isinstance(closed, CloseConnection) and closed.code == 1003


async def test_a_close_frame_ends_the_stream_and_is_answered() -> None:
    browser, server = await _opened(["mqtt"])
    got: list[bytes | Exception] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_receive, server, got)
        assert isinstance((await browser.events())[0], AcceptConnection)
        await browser.send(CloseConnection(1000))
    assert got == [b""]
    (answer,) = await browser.events()
    assert isinstance(answer, CloseConnection)
    with pytest.raises(trio.BrokenResourceError):
        await server.send_all(b"\x20\x02\x00\x00")


# -- a real broker, real paho clients --------------------------------------------------------------


@pytest.fixture(scope="module")
def ws_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, int]]:
    [port] = free_ports(1)
    data = str(tmp_path_factory.mktemp("ws"))
    args = ["--mqtt-ws-listen", f"127.0.0.1:{port}"]
    with LocalCluster(data, 1, mqtt=True, mqtt_rules=RULES, extra_args=args) as cluster:
        yield cluster, port


@pytest.mark.parametrize("version", [paho.MQTTv311, paho.MQTTv5], ids=["3.1.1", "5"])
def test_a_device_publishes_and_subscribes_over_websocket(
    ws_cluster: tuple[LocalCluster, int], version: int
) -> None:
    cluster, port = ws_cluster
    device = f"phone-{uuid.uuid4().hex[:8]}"
    phone = PahoDevice(("127.0.0.1", port), device, version=version, transport="websockets")
    assert_round_trip(phone, device, cluster.bootstrap)


def test_a_command_reaches_a_websocket_device_from_a_tcp_one(
    ws_cluster: tuple[LocalCluster, int],
) -> None:
    cluster, port = ws_cluster
    device = f"phone-{uuid.uuid4().hex[:8]}"
    phone = PahoDevice(("127.0.0.1", port), device, transport="websockets")
    controller = PahoDevice(cluster.mqtt_address(0), f"ctl-{device}")
    try:
        phone.wait_connected()
        controller.wait_connected()
        phone.subscribe(f"phones/{device}/commands", qos=1)
        controller.publish(f"phones/{device}/commands", b"set-gain", qos=1)
        wait_for(lambda: phone.payloads() == [b"set-gain"], 10, "the command")
    finally:
        phone.close()
        controller.close()


def test_metadata_says_where_a_broker_listens_for_websocket_devices(
    ws_cluster: tuple[LocalCluster, int],
) -> None:
    cluster, port = ws_cluster
    with Client(cluster.bootstrap) as client:
        broker = client.refresh_metadata().brokers[0]
    assert (broker.mqtt_port, broker.mqtt_ws_port) == (cluster.mqtt_address(0)[1], port)
