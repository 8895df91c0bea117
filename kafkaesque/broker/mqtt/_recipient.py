"""What the egress and the retained store deliver to: a device, as far as they need to know it."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Protocol

from kafkaesque.protocol.mqtt import MqttSubscription


class Recipient(Hashable, Protocol):
    """A connected device's subscriptions and its outgoing queue (``MqttDevice`` is one)."""

    subscriptions: dict[str, MqttSubscription]
    client_id_bytes: bytes | None  # as records carry it, for No Local (None until connected)

    @property
    def catching_up(self) -> Mapping[tuple[str, int], object]:
        """The (log topic, partition)s that a resumed session redelivers itself: live
        deliveries from them skip its own subscriptions until it catches up (``_resume``)."""

    def deliver(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        where: tuple[str, int, int] | None = None,
        expires_ms: int | None = None,
        identifiers: tuple[int, ...] = (),
        forwarded: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        """Queue a PUBLISH to the device (see ``MqttDevice.deliver``)."""
