"""The floor of a trio-task-per-connection design (``bench.conn_memory``): a server that holds
idle TCP connections and does nothing else.

    python -m bench._bare_trio_server MODE

Prints its port on a line, then serves until killed. ``MODE``:

* ``task``: one task per connection (``trio.serve_listeners``' handler) waiting in
  ``FdStream.receive_some``, the broker's own stream: what one coroutine per connection costs;
* ``pair``: what an ``MqttDevice`` is made of, bare: the handler opens a nursery, starts a
  writer task waiting on a ``trio.Event`` and reads in the handler (two tasks, a nursery, a
  cancel scope and an event per connection);
* ``parked``: no task per connection: one task accepts, one waits on one ``epoll`` set holding
  every connection's socket and reads the ready ones: the floor of a design whose idle devices
  are parked in one poller (the socket object and its registration per connection).
"""

from __future__ import annotations

import select
import socket
import sys

import trio

from kafkaesque.fd_stream import FdListener

_RECEIVE_BYTES = 16 * 1024  # as the MQTT device reads


async def _task(stream: trio.abc.Stream) -> None:
    while await stream.receive_some(_RECEIVE_BYTES):
        pass


async def _writer(wake: trio.Event) -> None:
    await wake.wait()


async def _pair(stream: trio.abc.Stream) -> None:
    wake = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_writer, wake)
        while await stream.receive_some(_RECEIVE_BYTES):
            pass
        wake.set()


async def _park() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    listener.setblocking(False)
    print(listener.getsockname()[1], flush=True)
    parked: dict[int, socket.socket] = {}
    with listener, select.epoll() as poller:

        async def accept() -> None:
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(False)
                parked[sock.fileno()] = sock
                poller.register(sock.fileno(), select.EPOLLIN)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            while True:
                await trio.lowlevel.wait_readable(poller.fileno())
                for fd, _ in poller.poll(0):
                    sock = parked[fd]
                    try:
                        data = sock.recv(_RECEIVE_BYTES)
                    except BlockingIOError:
                        continue
                    if not data:
                        poller.unregister(fd)
                        del parked[fd]
                        sock.close()


async def _main(mode: str) -> None:
    if mode == "parked":
        await _park()
        return
    handler = {"task": _task, "pair": _pair}[mode]
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(handler, [FdListener(listener) for listener in listeners])


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in ("task", "pair", "parked"):
        print("usage: python -m bench._bare_trio_server task|pair|parked", file=sys.stderr)
        return 2
    trio.run(_main, sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
