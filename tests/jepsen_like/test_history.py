"""The history format: one flat JSON object per event, strict decoding, numbered lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafkaesque.jepsen_like.history import (
    Assign,
    Assignment,
    Commit,
    Crash,
    Event,
    FetchCommitted,
    FinalRead,
    HistoryError,
    HistoryWriter,
    InternalErrors,
    Nemesis,
    PartitionEnd,
    Poll,
    Read,
    ReplicaRead,
    Seek,
    Send,
    Subscribe,
    TopicPartition,
    parse_history,
    read_history,
    write_history,
)

ONE_OF_EACH = [
    Event("invoke", 3, 10, Send("t", "p3-0", partition=None, key="k", idempotent=True), "n1"),
    Event("ok", 3, 20, Send("t", "p3-0", partition=1, key="k", idempotent=True, offset=42), "n1"),
    Event("invoke", 4, 21, Assign((Seek("t", 0, 0), Seek("t", 1, None)))),
    Event("ok", 5, 22, Poll((Read("t", 0, 0, "p1-0"), Read("t", 1, 42, "p3-0")), "g", 7), "n2"),
    Event("ok", 6, 23, Subscribe("g", ("t", "u"))),
    Event("info", 6, 24, Crash()),
    Event("ok", 7, 25, Commit("g", "t", 0, 10, member="m7", generation=3)),
    Event("ok", 7, 26, FetchCommitted("g", "t", 0, None)),
    Event("ok", 7, 27, Assignment("g", "m7", 3, (TopicPartition("t", 0),))),
    Event("ok", "final", 28, FinalRead((TopicPartition("t", 0),), (Read("t", 0, 0, "p1-0"),))),
    Event("invoke", "nemesis", 29, Nemesis("partition", "start", ("n1", "n2"))),
    Event(
        "ok",
        "replica-1",
        30,
        ReplicaRead((PartitionEnd("t", 0, 5),), (Read("t", 0, 1, "p1-0"),)),
        "n1",
    ),
    # What the send failed with, as the client said it (issue 36: a G1a's error was unknown).
    Event(
        "fail",
        3,
        31,
        Send("t", "p3-1", partition=None, key="k", idempotent=True),
        error="KafkaesqueError(OUT_OF_ORDER_SEQUENCE, 'expected seq 23, got 24', ...)",
    ),
]


def test_every_operation_round_trips_through_json() -> None:
    for event in ONE_OF_EACH:
        line = event.to_json()
        assert "\n" not in line
        assert Event.from_json(line) == event


def test_the_line_is_one_flat_object_with_the_envelope_first() -> None:
    line = ONE_OF_EACH[1].to_json()
    assert json.loads(line) == {
        "type": "ok",
        "f": "send",
        "process": 3,
        "time": 20,
        "node": "n1",
        "topic": "t",
        "partition": 1,
        "key": "k",
        "value": "p3-0",
        "idempotent": True,
        "offset": 42,
    }
    assert line.startswith('{"type":"ok","f":"send","process":3,"time":20,')


def test_reads_are_written_as_compact_lists() -> None:
    d = json.loads(ONE_OF_EACH[3].to_json())
    assert d["reads"] == [["t", 0, 0, "p1-0"], ["t", 1, 42, "p3-0"]]
    assert json.loads(ONE_OF_EACH[2].to_json())["partitions"] == [["t", 0, 0], ["t", 1, None]]


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("[1, 2]", "not a JSON object"),
        ("{not json", "not JSON"),
        ('{"type":"done","f":"send","process":1,"time":0,"topic":"t","value":"v"}', "'type'"),
        ('{"type":"ok","f":"sned","process":1,"time":0,"topic":"t","value":"v"}', "'f'"),
        (
            '{"type":"fail","f":"send","process":1,"time":0,"error":7,"topic":"t","value":"v"}',
            "'error'",
        ),
        ('{"type":"ok","f":"send","process":1.5,"time":0,"topic":"t","value":"v"}', "'process'"),
        ('{"type":"ok","f":"send","process":1,"time":0.5,"topic":"t","value":"v"}', "'time'"),
        ('{"type":"ok","f":"send","process":1,"time":0,"topic":"t","value":7}', "'value'"),
        (
            '{"type":"ok","f":"send","process":1,"time":0,"topic":"t","value":"v","offset":true}',
            "'offset'",
        ),
        ('{"type":"ok","f":"poll","process":1,"time":0,"reads":[["t",0,"1","v"]]}', "'reads'"),
        (
            '{"type":"ok","f":"commit","process":1,"time":0,"group":"g","topic":"t","partition":0}',
            "'offset'",
        ),
        (
            '{"type":"ok","f":"nemesis","process":"n","time":0,"fault":"kill","phase":"go"}',
            "'phase'",
        ),
    ],
)
def test_malformed_lines_are_rejected_with_the_field_named(line: str, complaint: str) -> None:
    with pytest.raises(HistoryError, match=complaint):
        Event.from_json(line)


def test_the_writer_numbers_lines_and_appending_continues_the_numbering(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        assert [w.write(e) for e in ONE_OF_EACH[:3]] == [1, 2, 3]
    # Each write is flushed: a reader sees it before the writer closes.
    with HistoryWriter(path, fsync=True) as w:
        assert w.line_count == 3
        assert w.write(ONE_OF_EACH[3]) == 4
        assert read_history(path) == ONE_OF_EACH[:4]
    assert read_history(path) == ONE_OF_EACH[:4]


def test_a_torn_last_line_is_dropped_on_read_and_refused_on_append(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    write_history(path, ONE_OF_EACH[:2])
    with path.open("a") as f:
        f.write(ONE_OF_EACH[2].to_json()[:15])  # the harness died mid-write
    assert read_history(path) == ONE_OF_EACH[:2]
    with pytest.raises(HistoryError, match=r"history.jsonl:3: not JSON"):
        read_history(path, allow_torn_tail=False)
    with pytest.raises(HistoryError, match="torn"):
        HistoryWriter(path)


def test_a_last_line_without_newline_that_decodes_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(ONE_OF_EACH[0].to_json() + "\n" + ONE_OF_EACH[1].to_json())
    assert read_history(path) == ONE_OF_EACH[:2]


def test_bad_lines_in_the_middle_are_errors_naming_their_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    good = ONE_OF_EACH[0].to_json()
    path.write_text(f"{good}\n\n{good}\n")
    with pytest.raises(HistoryError, match=r"history.jsonl:2: blank line"):
        read_history(path)
    with pytest.raises(HistoryError, match=r"<history>:2: field 'time'"):
        parse_history([good, good.replace('"time":10', '"time":"10"')])


def test_write_history_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    write_history(path, ONE_OF_EACH)
    write_history(path, ONE_OF_EACH[:1])
    assert read_history(path) == ONE_OF_EACH[:1]


def test_describe_names_the_operation() -> None:
    assert ONE_OF_EACH[1].describe() == "ok send t/1 'p3-0' @42 by 3 via n1"
    assert ONE_OF_EACH[3].describe() == "ok poll of 2 records by 5 via n2"
    assert ONE_OF_EACH[8].describe() == "m7 of g gen 3 owns t/0 (by 7)"
    assert ONE_OF_EACH[10].describe() == "invoke nemesis start partition n1,n2"


# Property: any event hypothesis can build survives the round trip, whatever its strings hold.

_text = st.text(max_size=8)
_int = st.integers(-(2**63), 2**63 - 1)
_reads = st.lists(st.builds(Read, _text, _int, _int, _text), max_size=4).map(tuple)
_tps = st.lists(st.builds(TopicPartition, _text, _int), max_size=3).map(tuple)
_ops = st.one_of(
    st.builds(
        Send,
        _text,
        _text,
        st.none() | _int,
        st.none() | _text,
        st.booleans(),
        st.none() | _int,
    ),
    st.builds(Poll, _reads, st.none() | _text, st.none() | _int),
    st.builds(Assign, st.lists(st.builds(Seek, _text, _int, st.none() | _int)).map(tuple)),
    st.builds(Subscribe, _text, st.lists(_text, max_size=3).map(tuple)),
    st.builds(Crash),
    st.builds(Commit, _text, _text, _int, _int, st.none() | _text, st.none() | _int),
    st.builds(FetchCommitted, _text, _text, _int, st.none() | _int),
    st.builds(Assignment, _text, _text, _int, _tps),
    st.builds(FinalRead, _tps, _reads),
    st.builds(ReplicaRead, st.lists(st.builds(PartitionEnd, _text, _int, _int)).map(tuple), _reads),
    st.builds(Nemesis, _text, st.sampled_from(["start", "stop"]), st.lists(_text).map(tuple)),
    st.builds(InternalErrors, st.lists(_text, max_size=3).map(tuple)),
)
_events = st.builds(
    Event,
    st.sampled_from(["invoke", "ok", "fail", "info"]),
    st.one_of(_int, _text),
    _int,
    _ops,
    st.none() | _text,
    st.none() | _text,
)


@given(st.lists(_events, max_size=6))
def test_any_history_round_trips_through_a_file(events: list[Event]) -> None:
    lines = [e.to_json() for e in events]
    assert all("\n" not in line for line in lines)  # JSON escapes newlines inside strings
    assert parse_history(lines) == events
