"""The checker's power-loss rules, on hand-written histories: each one plants one violation into
a clean history and expects exactly that kind, proven by the lines that prove it; the clean
history is valid. The histories go through JSON and back, as a run's file does."""

from __future__ import annotations

from pathlib import Path

import trio
from kafkaesque.jepsen_like._workload import Recorder, WorkloadOptions, replica_reads
from kafkaesque.jepsen_like.checker import CheckResult, check
from kafkaesque.jepsen_like.history import (
    AddAcl,
    CreateTopic,
    Event,
    EventType,
    HardStates,
    HistoryWriter,
    InternalErrors,
    Leaders,
    MetadataSeen,
    Op,
    Process,
    RaftState,
    TopicPartition,
    read_history,
)
from kafkaesque.jepsen_like.runner import internal_errors

NEW = ("hard_state_regression", "double_vote", "metadata_regression", "leaderless")


def _history(items: list[tuple[EventType, Process, Op, str | None]]) -> list[Event]:
    events = [Event(k, p, i * 1000, op, node) for i, (k, p, op, node) in enumerate(items)]
    return [Event.from_json(e.to_json()) for e in events]


def _found(result: CheckResult) -> dict[str, list[tuple[int, ...]]]:
    return {k: [a.lines for a in result.anomalies[k]] for k in NEW if result.anomalies[k]}


def _states(*states: tuple[str, int, str | None]) -> tuple[RaftState, ...]:
    return tuple(RaftState(*s) for s in states)


def _cut(
    node: str, before: tuple[RaftState, ...], after: tuple[RaftState, ...]
) -> list[tuple[EventType, Process, Op, str | None]]:
    return [
        ("ok", "disk", HardStates("before-cut", before), node),
        ("ok", "disk", HardStates("after-cut", after), node),
    ]


def _clean() -> list[tuple[EventType, Process, Op, str | None]]:
    s = _states(("t/0", 3, "1"), ("controller", 7, "10.0.0.1:9094"))
    return [
        ("invoke", "admin", CreateTopic("t", 2), None),
        ("ok", "admin", CreateTopic("t", 2), None),
        *_cut("n1", s, s),  # lines 3, 4
        # Terms moved on (a new election) with other votes: no double vote.
        ("ok", "disk", HardStates("end", _states(("t/0", 4, "2"), ("controller", 8, None))), "n1"),
        ("ok", "harness", Leaders(0.5, ()), None),
        ("ok", "harness", MetadataSeen((("t", 2),)), "n0"),  # line 7
        ("ok", "harness", MetadataSeen((("t", 2), ("u", 1))), "n1"),  # line 8
    ]


def test_a_clean_history_has_none_of_the_power_loss_anomalies() -> None:
    result = check(_history(_clean()))
    assert _found(result) == {}
    assert result.valid, result.summary()
    for kind in NEW:
        assert f"{kind}: 0" in result.summary()


def test_a_term_or_vote_that_went_back_across_a_cut_is_a_regression() -> None:
    before = _states(("t/0", 3, "1"), ("t/1", 5, "2"), ("controller", 7, "a"), ("t/2", 1, None))
    after = _states(("t/0", 2, "1"), ("t/1", 5, None), ("controller", 7, "a"))
    result = check(_history([*_clean(), *_cut("n2", before, after)]))
    assert _found(result) == {"hard_state_regression": [(9, 10)] * 3}
    texts = [a.explanation for a in result.anomalies["hard_state_regression"]]
    assert "went back to term 2" in texts[0] and "lost its vote" in texts[1]
    assert "t/2" in texts[2] and "is gone" in texts[2]
    assert not result.valid


def test_two_votes_in_one_term_are_a_double_vote() -> None:
    items = [
        *_clean(),
        ("ok", "disk", HardStates("end", _states(("t/0", 3, "1"))), "n2"),  # line 9
        ("ok", "disk", HardStates("end", _states(("t/0", 3, "2"))), "n2"),  # line 10
    ]
    result = check(_history(items))
    assert _found(result) == {"double_vote": [(9, 10)]}
    # A group that disappeared from the broker in between (moved away, then back) starts over.
    items.insert(9, ("ok", "disk", HardStates("end", ()), "n2"))
    assert _found(check(_history(items))) == {}


def test_an_acknowledged_or_listed_topic_missing_later_is_a_metadata_regression() -> None:
    items = [
        *_clean(),
        ("ok", "harness", MetadataSeen((("t", 1), ("u", 1))), "n2"),  # line 9: t shrank
        ("ok", "harness", MetadataSeen((("t", 2),)), "n0"),  # line 10: u (listed at 8) gone
    ]
    result = check(_history(items))
    assert _found(result) == {"metadata_regression": [(2, 9), (8, 10)]}
    # A CREATE that was not acknowledged promises nothing.
    unsure = [
        ("invoke", "admin", CreateTopic("v", 1), None),
        ("info", "admin", CreateTopic("v", 1), None),
        *_clean(),
    ]
    assert _found(check(_history(unsure))) == {}


def test_an_acknowledged_or_listed_acl_missing_later_is_a_metadata_regression() -> None:
    acl = "User:probe-1 allow read topic t-probe-1 literal"
    other = "User:x allow read topic t literal"
    items = [
        ("invoke", "admin", AddAcl(acl), None),
        ("ok", "admin", AddAcl(acl), None),
        ("ok", "harness", MetadataSeen((), (acl, other)), "n0"),  # line 3
        ("ok", "harness", MetadataSeen((), None), "n1"),  # no ACL LIST answer: proves nothing
        ("ok", "harness", MetadataSeen((), (other,)), "n2"),  # line 5: the acked one is gone
        ("ok", "harness", MetadataSeen((), (acl,)), "n0"),  # line 6: the listed one is gone
    ]
    result = check(_history(items))
    assert _found(result) == {"metadata_regression": [(2, 5), (3, 6)]}


def test_a_partition_with_no_leader_after_every_broker_is_back_is_leaderless() -> None:
    items = [*_clean(), ("ok", "harness", Leaders(30.0, (TopicPartition("t", 1),)), None)]
    result = check(_history(items))
    assert _found(result) == {"leaderless": [(9,)]}
    assert result.anomalies["leaderless"][0].partition == TopicPartition("t", 1)


def test_an_internal_error_in_a_brokers_log_makes_the_run_invalid() -> None:
    crash = "broker-1.log: kafkaesque broker: internal error: RaftInvariantError: ... (a bug ...)"
    items = [*_clean(), ("ok", "harness", InternalErrors((crash,)), None)]
    result = check(_history(items))
    assert not result.valid
    (found,) = result.anomalies["internal_error"]
    assert found.lines == (9,) and found.explanation == crash
    assert check(_history([*_clean(), ("ok", "harness", InternalErrors(()), None)])).valid


def test_the_harness_finds_each_internal_error_line_in_every_brokers_log(tmp_path: Path) -> None:
    (tmp_path / "broker-0.log").write_text("ready\nbroker 0 stopped\n")
    (tmp_path / "broker-2.log").write_text(
        "ready\nkafkaesque broker: internal error: KeyError: 3 (a bug in Kafkaesque; ...)\n"
        "kafkaesque broker: broker 2 stopped: the fsync helper (pid 9) ended\n"
    )
    (tmp_path / "harness.log").write_text("kafkaesque broker: internal error: not a broker's\n")
    assert internal_errors(str(tmp_path)) == (
        "broker-2.log: kafkaesque broker: internal error: KeyError: 3 (a bug in Kafkaesque; ...)",
    )
    assert internal_errors(str(tmp_path / "none")) == ()


def test_with_no_broker_running_at_the_end_the_replica_reads_read_nothing(tmp_path: Path) -> None:
    """Every broker stopped on its own (``internal_error`` says why): the run still ends with a
    history to check, where the replica reads used to raise that the bootstrap list is empty."""

    async def no_ends() -> dict[int, int]:
        raise AssertionError("nothing to ask")

    recorder = Recorder(HistoryWriter(tmp_path / "history.jsonl"))
    trio.run(replica_reads, recorder, {}, WorkloadOptions(), no_ends)
    assert read_history(tmp_path / "history.jsonl") == []
