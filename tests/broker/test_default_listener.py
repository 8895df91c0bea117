"""A listener on by default (Kafka, REST) stays off when its default port is taken; one asked
for explicitly must bind."""

from __future__ import annotations

import socket
from collections.abc import Awaitable

import pytest
import trio

from kafkaesque.broker._config import Address
from kafkaesque.broker._default_listener import open_listeners


def test_a_taken_default_port_leaves_the_listener_off_and_an_explicit_one_fails() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        where = Address("127.0.0.1", taken.getsockname()[1])

        async def main() -> None:
            def opening(at: Address, explicit: bool) -> Awaitable[list[trio.SocketListener] | None]:
                return open_listeners(
                    at, explicit=explicit, what="REST", flag="--http-listen", broker_id=0
                )

            assert await opening(where, False) is None
            with pytest.raises(OSError):
                await opening(where, True)
            free = await opening(Address("127.0.0.1", 0), False)
            assert free is not None
            for listener in free:
                await listener.aclose()

        trio.run(main)
