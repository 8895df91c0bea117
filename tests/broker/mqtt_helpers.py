"""Shared helpers of the MQTT listener tests: rules, paho clients, raw sockets, reading back."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from kafkaesque.client import Client, Consumer, ConsumerRecord
from kafkaesque.protocol.mqtt import (
    Connack,
    Connect,
    MqttDecoder,
    MqttPacket,
    MqttVersion,
    encode_mqtt,
)

RULES = "phones/+/spectrum -> readings key=1\nphones/+/commands -> commands key=1\n"


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


class PahoDevice:
    """A paho client run on its own network thread; collects what it receives."""

    def __init__(
        self,
        address: tuple[str, int],
        client_id: str,
        *,
        version: int = paho.MQTTv311,
        clean: bool = True,
        username: str | None = None,
        password: str | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        keepalive: int = 30,
        configure: Callable[[paho.Client], None] | None = None,
        transport: str = "tcp",
    ) -> None:
        """``configure`` sets the client up before it connects (TLS, say); ``transport`` is
        paho's ("websockets": MQTT over WebSocket)."""
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": version}
        kwargs["transport"] = transport
        if version != paho.MQTTv5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(CallbackAPIVersion.VERSION2, **kwargs)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(will[0], will[1], will[2], will[3])
        self.messages: list[paho.MQTTMessage] = []
        self.connack: list[Any] = []
        self.connack_properties: list[Any] = []  # paho's Properties of each CONNACK (v5)
        self.disconnect_reasons: list[Any] = []  # paho's ReasonCode of each disconnection
        self.disconnected = threading.Event()
        self._lock = threading.Lock()
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        if configure is not None:
            configure(self.client)
        self.client.connect(address[0], address[1], keepalive=keepalive)
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack_properties.append(props)
        self.connack.append(rc)  # last: a waiter on ``connack`` finds the properties there

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnect_reasons.append(rc)
        self.disconnected.set()

    def _on_message(self, client: Any, userdata: Any, message: paho.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(message)

    def wait_connected(self, timeout: float = 20.0) -> None:
        wait_for(lambda: bool(self.connack), timeout, "CONNACK")

    def payloads(self) -> list[bytes]:
        with self._lock:
            return [bytes(m.payload) for m in self.messages]

    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 20.0) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *a: done.set()
        self.client.subscribe(topic_filter, qos)
        assert done.wait(timeout), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(30)
        assert info.is_published()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class RawMqtt:
    """A bare socket speaking MQTT through our codec (for what paho will not send)."""

    def __init__(
        self,
        address: tuple[str, int],
        version: MqttVersion = MqttVersion.V311,
        source: str | None = None,
    ):
        """``source``: the local (loopback) address to connect from, e.g. ``127.0.0.2``."""
        self.sock = socket.create_connection(
            address, timeout=10, source_address=None if source is None else (source, 0)
        )
        self.version = version
        self.decoder = MqttDecoder(server_side=False, version=version)
        self.pending: list[MqttPacket] = []

    def connect(self, client_id: str, **kw: Any) -> Connack:
        self.send(encode_mqtt(Connect(client_id, **kw), self.version))
        packet = self.receive()
        assert isinstance(packet, Connack)
        return packet

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float = 10.0) -> MqttPacket | None:
        """The next packet, or None when the server closed the connection."""
        self.sock.settimeout(timeout)
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.decoder.feed(data)
            self.pending.extend(self.decoder.decode_many())
        return self.pending.pop(0)

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """Whether the server closes the connection (reading and discarding until then)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def read_topic(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its high watermarks, through the client library."""
    with Client(bootstrap) as client, Consumer(client) as consumer:
        consumer.assign_topic(topic)
        consumer.seek_to_beginning()
        return list(consumer.records(follow=False))


def keyed_records(bootstrap: str, topic: str, key: str) -> list[ConsumerRecord]:
    """``read_topic``'s records of ``topic`` under the key ``key`` (one device's, say)."""
    return [r for r in read_topic(bootstrap, topic) if r.key == key.encode()]


def headers_of(record: ConsumerRecord) -> dict[str, bytes]:
    return dict(record.headers)


def assert_round_trip(phone: PahoDevice, device: str, bootstrap: str) -> None:
    """``phone`` (device ``device``, mapped by ``RULES``) subscribes to its own topics and
    publishes a reading: it gets the reading back, and the log holds it once. Closes ``phone``."""
    try:
        phone.wait_connected()
        phone.subscribe(f"phones/{device}/#", qos=1)
        phone.publish(f"phones/{device}/spectrum", b"-71 dB", qos=1)  # waits for the PUBACK
        wait_for(lambda: phone.payloads() == [b"-71 dB"], 10, "the message back")
    finally:
        phone.close()
    assert [r.value for r in keyed_records(bootstrap, "readings", device)] == [b"-71 dB"]
