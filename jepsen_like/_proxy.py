"""Per-link TCP proxies between brokers: partitions, one-way cuts, latency and loss in user space.

Brokers keep one peer connection per pair, dialled by the lower id (see raft/_transport.py), so
there is one proxy ``Link`` per pair ``(a, b)``, ``a < b``: broker ``a`` is told that ``b``
listens at the proxy, which dials ``b``'s real address. The proxy runs in the harness's trio
loop. What it can do to a TCP stream, and what it cannot:

* a two-way cut closes the link's connections and closes every new one at once (a peer sees
  "connection refused/reset", as after a partition that outlived TCP's retries);
* a one-way cut stalls one direction: bytes from ``src`` to ``dst`` are held, not dropped (TCP
  cannot lose bytes in the middle of a stream without the receiver noticing garbage), so the
  sender's buffers fill and it sees a peer that stopped listening;
* latency delays every chunk by ``delay_s`` in both directions, keeping their order;
* loss cannot drop bytes either: each chunk resets its connection with probability ``loss``,
  which is what a lossy link looks like to a TCP user (retransmission stalls, then resets).

Without root, the harness runs every broker on 127.0.0.1 and these proxies are the only network
faults; with namespaces they add latency and loss on top of the route-based cuts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ._cluster import Placement

_CHUNK = 64 * 1024


@dataclass(slots=True)
class _Faults:
    blocked: set[tuple[int, int]] = field(default_factory=set)  # (src, dst) directions cut
    delay_s: float = 0.0
    loss: float = 0.0


class Link:
    """The proxy of the pair ``(a, b)``: listens for ``a``, dials ``b`` at ``target``."""

    def __init__(
        self, a: int, b: int, target: tuple[str, int], faults: _Faults, rng: random.Random
    ) -> None:
        self.a, self.b = a, b
        self.target = target
        self._faults = faults
        self._rng = rng
        self._scopes: set[trio.CancelScope] = set()
        self.changed = trio.Event()
        self.port = 0
        self.connections = 0

    @property
    def cut_both(self) -> bool:
        blocked = self._faults.blocked
        return (self.a, self.b) in blocked and (self.b, self.a) in blocked

    def notify(self) -> None:
        """Faults changed: close connections of a link cut both ways, wake stalled pumps."""
        if self.cut_both:
            for scope in self._scopes:
                scope.cancel()
        self.changed.set()
        self.changed = trio.Event()

    async def serve(self, host: str, *, task_status: trio.TaskStatus[int]) -> None:
        """Listen on ``host`` (port picked by the kernel); reports the port, serves until
        cancelled."""
        listeners = await trio.open_tcp_listeners(0, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, inbound: trio.SocketStream) -> None:
        async with inbound:
            if self.cut_both:
                return
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    outbound = await trio.open_tcp_stream(*self.target)
                except OSError:
                    return
                self.connections += 1
                async with outbound, trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, inbound, outbound, (self.a, self.b), scope)
                    nursery.start_soon(self._pump, outbound, inbound, (self.b, self.a), scope)
            self._scopes.discard(scope)

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        direction: tuple[int, int],
        scope: trio.CancelScope,
    ) -> None:
        send, receive = trio.open_memory_channel[tuple[float, bytes]](64)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, receive, sink, scope)
            async with send:
                while True:
                    while direction in self._faults.blocked:  # one-way cut: hold, do not read
                        await self.changed.wait()
                    try:
                        data = await source.receive_some(_CHUNK)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        scope.cancel()
                        return
                    if self._faults.loss and self._rng.random() < self._faults.loss:
                        scope.cancel()  # a lossy link, as TCP shows it: the connection resets
                        return
                    await send.send((trio.current_time() + self._faults.delay_s, data))

    async def _deliver(
        self,
        receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
        sink: trio.SocketStream,
        scope: trio.CancelScope,
    ) -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                try:
                    await sink.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    scope.cancel()
                    return


class ProxyLayer:
    """The links of every broker pair and the faults they apply. Trio thread only."""

    def __init__(self, host: str, *, seed: int = 0) -> None:
        self.host = host
        self._faults = _Faults()
        self._rng = random.Random(seed)
        self.links: dict[tuple[int, int], Link] = {}

    async def add_link(self, nursery: trio.Nursery, a: int, b: int, target: tuple[str, int]) -> int:
        """Start the proxy for pair ``(a, b)`` (``a < b``) dialling ``target``; returns its
        port."""
        if a >= b:
            raise ValueError("the lower id dials: links are (a, b) with a < b")
        link = Link(a, b, target, self._faults, self._rng)
        self.links[(a, b)] = link
        port: int = await nursery.start(link.serve, self.host)
        return port

    async def link_all(self, nursery: trio.Nursery, placement: Placement, nodes: int) -> None:
        """A link between every pair of the first ``nodes`` nodes of ``placement``; the dialling
        (lower-id) node of each pair reaches the other through it (``placement.peer_views``)."""
        for a in range(nodes):
            for b in range(a + 1, nodes):
                target = (placement.nodes[b].host, placement.nodes[b].peer)
                port = await self.add_link(nursery, a, b, target)
                placement.peer_views.setdefault(a, {})[b] = (self.host, port)

    def port(self, a: int, b: int) -> int:
        return self.links[(min(a, b), max(a, b))].port

    def _notify(self) -> None:
        for link in self.links.values():
            link.notify()

    def cut(self, src: int, dst: int) -> None:
        """Stop traffic from ``src`` to ``dst`` (a one-way cut; call twice for two ways)."""
        self._faults.blocked.add((src, dst))
        self._notify()

    def set_delay(self, seconds: float) -> None:
        """Delay every chunk on every link by ``seconds``."""
        self._faults.delay_s = seconds
        self._notify()

    def set_loss(self, probability: float) -> None:
        """Reset a connection with this probability per chunk forwarded."""
        self._faults.loss = probability
        self._notify()

    def heal(self) -> None:
        """Remove every cut, delay and loss."""
        self._faults.blocked.clear()
        self._faults.delay_s = 0.0
        self._faults.loss = 0.0
        self._notify()
