"""DeleteGroups against a membership save in flight: the group stays deleted.

The last member's leave makes the coordinator save the group's (now empty) membership, a write
of its own; a DeleteGroups that tombstones the group while that write is in flight used to
return before it landed, and the save then brought the group back (DescribeGroups answered
Empty, not Dead: seen once in tests/broker/test_kafka_groups.py). The coordinator's log is a
dict here, and the save waits at a gate the test opens.
"""

from __future__ import annotations

from typing import Any

import trio

from kafkaesque.broker.kafka._groups import KafkaGroups
from kafkaesque.protocol.kafka import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    Api,
    KafkaError,
    KafkaRequest,
)


class _Log:
    """The offsets partition's Kafka group records, as the coordinator reads and writes them."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}
        self.gate = trio.Event()
        self.saves_started = 0

    async def offsets_partition(self, group_id: str) -> int:
        return 0

    def leading_term(self, partition: int) -> int:
        return 1

    async def kafka_group(self, partition: int, group: str) -> Any:
        return self.saved.get(group)

    async def kafka_groups(self, partition: int) -> set[str]:
        return set(self.saved)

    async def save_kafka_group(self, partition: int, group: str, saved: Any) -> None:
        self.saves_started += 1
        await self.gate.wait()
        self.saved[group] = saved

    async def delete_kafka_group(self, partition: int, group: str) -> bool:
        return self.saved.pop(group, None) is not None


class _Everyone:
    def allows(self, *args: Any) -> bool:
        return True


def _request(api: Api, body: dict[str, Any]) -> KafkaRequest:
    return KafkaRequest(api, 0, 1, "test", body)


async def test_a_delete_waits_for_the_save_in_flight_and_the_group_stays_dead() -> None:
    log = _Log()
    groups = KafkaGroups(log, None, _Everyone(), 0.0)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(groups.run)
        # A group with an unsaved membership (as after its last member left).
        group = await groups._group("g", create=True)
        assert group is not None and not isinstance(group, KafkaError)
        groups._held["g"].saved = None
        with trio.fail_after(5):
            while log.saves_started == 0:  # the coordinator's tick starts the save
                await trio.sleep(0.01)
        answered = trio.Event()

        async def delete() -> None:
            request = _request(DELETE_GROUPS, {"groups_names": ["g"]})
            results = (await groups.delete_groups(request, None))["results"]  # type: ignore[arg-type]
            assert results == [{"group_id": "g", "error_code": KafkaError.NONE}]
            answered.set()

        nursery.start_soon(delete)
        await trio.sleep(0.3)  # a few ticks: the delete must not answer while the save hangs
        assert not answered.is_set()
        log.gate.set()
        with trio.fail_after(5):
            await answered.wait()
        described = await groups.describe_groups(
            _request(DESCRIBE_GROUPS, {"groups": ["g"]}),
            None,  # type: ignore[arg-type]
        )
        assert described["groups"][0]["group_state"] == "Dead"
        nursery.cancel_scope.cancel()
