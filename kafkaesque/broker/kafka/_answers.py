"""The responses of one Kafka connection, written in request order.

Each request read gets an ``Answer`` in the connection's order; whoever learns the response
``give``s it: the reader for most requests, the Raft group's commit for a pipelined Produce
(``ProduceInFlight.tell``), in whatever order trio runs them. ``send_in_order`` writes them in
request order, and every answer already given behind the first goes in the same write: the
pipelined Produces that one Raft round commits are answered with one ``send_all`` and one pass
of the scheduler, not one of each per Produce (a librdkafka producer at linger 0 sends one
Produce per record, and its answers queued behind each other's passes).
"""

from __future__ import annotations

import trio


class Answer:
    """The response to one request, in the connection's order: ``data`` once ``done``
    (empty: nothing to send, as for a Produce with acks=0)."""

    __slots__ = ("data", "done")

    def __init__(self, data: bytes | None = None) -> None:
        self.done = trio.Event()
        self.data = b""
        if data is not None:
            self.give(data)

    def give(self, data: bytes) -> None:
        """The response is ``data``; once only (a later call is ignored)."""
        if not self.done.is_set():
            self.data = data
            self.done.set()


async def send_in_order(
    stream: trio.abc.SendStream, in_order: trio.MemoryReceiveChannel[Answer]
) -> None:
    """Write each answer of ``in_order`` to ``stream`` once it is given, in the channel's order,
    until the channel closes; the answers given by the time the first of them is ready are
    written together, in one ``send_all``."""
    async with in_order:
        head: Answer | None = None
        while True:
            if head is None:
                try:
                    head = await in_order.receive()
                except trio.EndOfChannel:
                    return
            await head.done.wait()
            chunks: list[bytes] = []
            while head is not None and head.done.is_set():
                if head.data:
                    chunks.append(head.data)
                try:
                    head = in_order.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    head = None
            if chunks:
                await stream.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
