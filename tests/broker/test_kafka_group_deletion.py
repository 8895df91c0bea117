"""DeleteGroups against the coordinator's membership writes (a pure unit: the group front of
``kafkaesque/broker/kafka/_groups.py`` over a fake offsets coordinator, on trio's mock clock).

confluent-kafka-go's own suite (tests/peers/test_kafka_client_suites.py) once saw a group deleted
right after its last member left listed again as Empty: the membership write of that leave
could land in the log after the deletion. Deleting must wait for a write in flight and stop the
timer from starting one, whatever the timing.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from kafkaesque.broker.kafka._groups import KafkaGroups
from kafkaesque.protocol.kafka import DELETE_GROUPS, KafkaError, KafkaRequest


class FakeOffsets:
    """The offsets coordinator as KafkaGroups sees it: one partition this broker leads; the
    membership writes and the deletion wait for the test to release them, and say when."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release_save = trio.Event()
        self.release_delete = trio.Event()

    async def offsets_partition(self, group_id: str) -> int:
        return 0  # no checkpoint: as a cached answer

    def leading_term(self, partition: int) -> int:
        return 1

    async def kafka_group(self, partition: int, group_id: str) -> Any:
        return None

    async def kafka_groups(self, partition: int) -> list[str]:
        return []

    async def save_kafka_group(self, partition: int, group_id: str, saved: Any) -> None:
        self.events.append("save-start")
        await self.release_save.wait()
        self.events.append("save-end")

    async def delete_kafka_group(self, partition: int, group_id: str) -> bool:
        self.events.append("delete-start")
        await self.release_delete.wait()
        self.events.append("delete-end")
        return True


class AllowAll:
    def allows(self, *_: Any) -> bool:
        return True


def _delete_request() -> KafkaRequest:
    return KafkaRequest(DELETE_GROUPS, 1, 1, "t", {"groups_names": ["g"]})


async def _held_group_with_unsaved_membership(groups: KafkaGroups) -> None:
    """A group held here whose membership changed since it was last written (its last member
    left): the timer writes it at its next tick."""
    await groups._group("g", create=True)
    groups._held["g"].saved = None


def _run(test: Any) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_no_membership_write_starts_once_the_deletion_has() -> None:
    async def main() -> None:
        offsets = FakeOffsets()
        offsets.release_save.set()
        groups = KafkaGroups(offsets, None, AllowAll(), 0.0)  # type: ignore[arg-type]
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(groups.run)
            await _held_group_with_unsaved_membership(groups)
            # No checkpoint until the deletion's write: the timer has not seen the change.
            nursery.start_soon(lambda: _answer(groups, answers))
            await trio.sleep(1.0)  # ten ticks while the deletion is being written
            offsets.release_delete.set()
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        assert offsets.events == ["delete-start", "delete-end"]
        assert answers == [KafkaError.NONE]

    _run(main)


def test_a_membership_write_in_flight_lands_before_the_deletion() -> None:
    async def main() -> None:
        offsets = FakeOffsets()
        offsets.release_delete.set()
        groups = KafkaGroups(offsets, None, AllowAll(), 0.0)  # type: ignore[arg-type]
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(groups.run)
            await _held_group_with_unsaved_membership(groups)
            await trio.sleep(0.5)  # the timer starts the write; it waits
            assert offsets.events == ["save-start"]
            nursery.start_soon(lambda: _answer(groups, answers))
            await trio.sleep(1.0)
            assert offsets.events == ["save-start"]  # the deletion waits for it
            offsets.release_save.set()
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        assert offsets.events == ["save-start", "save-end", "delete-start", "delete-end"]
        assert answers == [KafkaError.NONE]

    _run(main)


async def _answer(groups: KafkaGroups, answers: list[Any]) -> None:
    response = await groups.delete_groups(_delete_request(), None)  # type: ignore[arg-type]
    answers.extend(r["error_code"] for r in response["results"])
