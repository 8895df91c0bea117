"""Following a one-partition internal topic from its start: every committed record, in order.

The MQTT listener keeps two tables that every broker must know, retained messages and
persistent sessions, in compacted internal topics; each broker reads them into memory with a
``TopicTail`` and follows them by long-polling the partition's leader. ``catch_up`` waits until
the table holds everything committed before the call: a device reconnecting to another broker
right after its old broker wrote its session sees that write.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from kafkaesque.storage import Record, data_records, end_offset

from .._errors import RequestError
from .._metadata_view import TopicInfo
from .._read_path import ReadPath

log = logging.getLogger("kafkaesque.broker.mqtt")

_FETCH_BYTES: Final = 1 << 20
_LONG_POLL_S: Final = 1.0
_RETRY_S: Final = 0.5
_CATCH_UP_S: Final = 5.0


class TopicTail:
    """Applies every record of partition 0 of ``topic`` to ``apply``, from the start."""

    def __init__(
        self,
        reads: ReadPath,
        topic: str,
        ensure_topic: Callable[[str], Awaitable[TopicInfo]],
        apply: Callable[[Record], None],
    ) -> None:
        self._reads = reads
        self._topic = topic
        self._ensure_topic = ensure_topic
        self._apply = apply
        self.offset = 0  # the next offset to apply
        self.loaded = trio.Event()  # set once read up to the end seen at startup
        self._moved = trio.Event()

    async def run(self) -> None:
        """Read and follow the topic until cancelled (creating it when missing)."""
        while True:
            try:
                await self._ensure_topic(self._topic)
                break
            except RequestError as exc:
                log.info("mqtt: %s is not available yet: %s", self._topic, exc)
                await trio.sleep(_RETRY_S)
        reads = self._reads
        while True:
            try:
                wait_s = _LONG_POLL_S if self.loaded.is_set() else 0.0
                fetched, self.offset = await reads.follow(
                    self._topic, 0, self.offset, _FETCH_BYTES, wait_s
                )
            except RequestError as exc:
                log.debug("mqtt: reading %s: %s; retrying", self._topic, exc)
                await trio.sleep(_RETRY_S)
                continue
            self._apply_batches(fetched.data)
            if not fetched.data and self.offset >= fetched.high_watermark:
                self.loaded.set()
            self._moved.set()
            self._moved = trio.Event()

    def _apply_batches(self, data: bytes | memoryview) -> None:
        # The log verified them on read; the next offset is past control batches too.
        for record in data_records(data, self.offset, verify=False):
            self._apply(record)
        end = end_offset(data)
        if end is not None:
            self.offset = max(self.offset, end)

    async def reach(self, offset: int) -> None:
        """Wait until every record before ``offset`` is applied."""
        while self.offset < offset:
            await self._moved.wait()

    async def moved(self) -> None:
        """Wait for the next read of the topic (new records applied, or a long poll ended)."""
        await self._moved.wait()

    async def catch_up(self) -> bool:
        """Wait until everything committed now is applied; False if that took too long."""
        with trio.move_on_after(_CATCH_UP_S):
            await self.loaded.wait()
            reads = self._reads
            try:
                fetched = await reads.fetch(self._topic, 0, self.offset, 1, 0)
            except RequestError:
                return False
            end = fetched.high_watermark
            while self.offset < end:
                await self._moved.wait()
            return True
        return False
