"""OffsetForLeaderEpoch's answer (``epoch_end_offset``) against Kafka's rules
(``LeaderEpochFileCache.endOffsetFor``), on logs whose terms are the leader epochs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kafkaesque.broker.kafka._handlers import epoch_end_offset


@dataclass
class TermsLog:
    """A log of ``terms[i]`` at offset ``start + i``."""

    terms: list[int]
    start: int = 0

    def term_start_offset(self, term: int) -> int:
        for i, t in enumerate(self.terms):
            if t >= term:
                return self.start + i
        return self.last_index() + 1

    def term_at(self, index: int) -> int:
        return self.terms[index - self.start]

    def start_offset(self) -> int:
        return self.start

    def last_index(self) -> int:
        return self.start + len(self.terms) - 1


# Offsets 0-2 in term 1, 3-4 in term 3 (term 2 never appended: a leader elected and gone),
# 5-7 in term 6 (the current term; the log ends at 8).
LOG = TermsLog([1, 1, 1, 3, 3, 6, 6, 6])


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (6, (6, 8)),  # the current epoch ends at the log end
        (3, (3, 5)),  # an earlier epoch ends where the next one starts
        (1, (1, 3)),
        (2, (1, 3)),  # an epoch with no entry: the largest below it, ending at the next start
        (4, (3, 5)),
        (5, (3, 5)),
        (0, (0, 0)),  # below every epoch: itself, ending where the first one starts
        (9, (-1, -1)),  # above every epoch
        (-1, (-1, -1)),
    ],
)
def test_each_epoch_ends_where_kafka_says(epoch: int, expected: tuple[int, int]) -> None:
    assert epoch_end_offset(LOG, 6, 8, epoch) == expected


def test_a_log_that_starts_later_answers_from_its_first_offset() -> None:
    log = TermsLog([3, 3, 6], start=100)  # retention removed offsets 0-99
    assert epoch_end_offset(log, 6, 103, 1) == (1, 100)
    assert epoch_end_offset(log, 6, 103, 3) == (3, 102)
    assert epoch_end_offset(log, 6, 103, 6) == (6, 103)


def test_a_consumer_position_after_a_failover_is_not_seen_as_truncated() -> None:
    """A consumer read offsets up to 4 (term 3); the leader changed (term 6 began at 5): its
    position 5 is at the end of epoch 3, not past it, so it keeps reading (no reset)."""
    _, end = epoch_end_offset(LOG, 6, 8, 3)
    assert end >= 5
