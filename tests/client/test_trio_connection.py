"""``TrioConnection.abort``: a connection given up on (its broker went silent) fails its waiters
at once, refuses new sends, and never reads the late reply (issue 23)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from kafkaesque.client._errors import KafkaesqueConnectionError, leader_moved
from kafkaesque.client._trio_connection import TrioConnection
from kafkaesque.protocol import OkReply, Ping


async def test_an_aborted_connection_fails_its_waiter_and_never_reads_the_late_reply() -> None:
    client_end, broker_end = trio.testing.memory_stream_pair()
    connection = TrioConnection(("127.0.0.1", 1), client_end)
    ticket = await connection.send(Ping())
    assert await broker_end.receive_some(1024)  # the broker got the command, and goes silent
    error = leader_moved("127.0.0.1:1", 1000)
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await connection.wait(ticket)
        except KafkaesqueConnectionError as exc:
            outcome.append(exc)

    with trio.fail_after(5):  # the waiter would otherwise wait for the silent broker forever
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            connection.abort(error)
    assert outcome == [error] and error.outcome_unknown and error.retriable
    await broker_end.send_all(b"+OK PONG\r\n")  # the late reply
    with pytest.raises(KafkaesqueConnectionError, match="another leader"):
        await connection.wait(ticket)
    with pytest.raises(KafkaesqueConnectionError, match="is closed"):
        await connection.send(Ping())
    assert connection.closed and connection.failure is error
    await connection.aclose()


async def test_a_connection_not_aborted_reads_its_reply() -> None:
    client_end, broker_end = trio.testing.memory_stream_pair()
    connection = TrioConnection(("127.0.0.1", 1), client_end)
    ticket = await connection.send(Ping())
    await broker_end.receive_some(1024)
    await broker_end.send_all(b"+OK PONG\r\n")
    assert await connection.wait(ticket) == OkReply("PONG")
    await connection.aclose()
