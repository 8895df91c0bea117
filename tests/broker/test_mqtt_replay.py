"""The catch-up's shortcut through a decoded stretch of the log (``_replay.Stretch``).

A resumed session visits only the records of the exact topics it subscribes to and the ones it
owes (``Stretch.candidates``), instead of every record of the partition. Checked with
hypothesis against the full scan it replaces: for any stretch, session progress and exact
subscriptions, the records the catch-up acts on (delivers, resends, or gives up because they
map to no MQTT topic any more) are the same, in the same order.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.broker.mqtt._replay import Replayed, Stretch
from kafkaesque.broker.mqtt._resume import CatchUp, Owed, Progress
from kafkaesque.protocol.mqtt import Origin, mqtt_topic_matches

TOPICS = ["phones/a/commands", "phones/b/commands", "phones/c/commands", None]
ORIGIN = Origin(1, None, False, None, ())


def _stretch(topics: list[str | None], gaps: list[bool], start: int) -> Stretch:
    records = []
    offset = start
    for topic, gap in zip(topics, gaps, strict=True):
        offset += 2 if gap else 1  # a control batch's offset between some records
        records.append(Replayed(offset, topic, b"x", ORIGIN, 0))
    return Stretch(start, offset + 1, start, records)


def _acted_on(
    records: list[Replayed], catch: CatchUp, filters: list[str], high: int
) -> list[tuple[int, int]]:
    """What a catch-up does with ``records`` (offset, resent packet id or 0), up to ``high``."""
    acted = []
    for record in records:
        if record.offset < catch.cursor or record.offset >= high:
            continue
        decided = catch.decide(record.offset)
        catch.advance(record.offset + 1)
        if decided is None:
            continue
        matching = record.topic is not None and any(
            mqtt_topic_matches(f, record.topic) for f in filters
        )
        # (A new record that maps to no MQTT topic is nothing to the session: the full scan
        # only logged it as given up.)
        gone = record.topic is None and record.offset < catch.next
        if gone or decided.packet_id or matching:
            acted.append((record.offset, decided.packet_id))
    return acted


@given(
    st.lists(st.tuples(st.sampled_from(TOPICS), st.booleans()), min_size=1, max_size=40),
    st.lists(st.sampled_from(TOPICS[:3]), max_size=2),
    st.integers(0, 50),
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), max_size=6),
    st.integers(0, 60),
)
def test_the_candidates_are_what_a_full_scan_acts_on(
    records: list[tuple[str | None, bool]],
    filters: list[str],
    next_: int,
    owed: list[tuple[int, int]],
    high: int,
) -> None:
    stretch = _stretch([t for t, _ in records], [g for _, g in records], 0)
    owed_below = {o: Owed(o, packet_id=p, qos=1 if p else 0) for o, p in owed if o < next_}
    progress = Progress(next_, tuple(sorted(owed_below.values())))
    full, short = CatchUp(progress), CatchUp(progress)
    expected = _acted_on(stretch.records, full, filters, high)
    picked = stretch.candidates(short.cursor, high, set(filters), short.owed_offsets())
    assert _acted_on(picked, short, filters, high) == expected
    every = stretch.candidates(0, high, None, [])
    assert every == [r for r in stretch.records if r.offset < high]
