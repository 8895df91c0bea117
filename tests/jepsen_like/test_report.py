"""The report of a run: plots and an HTML page built from a history and its check alone."""

from __future__ import annotations

from pathlib import Path

from kafkaesque.cli.main import build_parser
from kafkaesque.jepsen_like._report import write_report
from kafkaesque.jepsen_like.checker import check_file
from kafkaesque.jepsen_like.history import Event, FinalRead, Nemesis, Read, Send, write_history
from kafkaesque.jepsen_like.history import TopicPartition as TP

_S = 1_000_000_000


def _history(path: Path, *, lose: bool) -> None:
    events = []
    t = 0
    for i in range(20):
        value = f"p0-{i}"
        events.append(Event("invoke", 0, t, Send("t", value, idempotent=True)))
        t += _S // 10
        events.append(Event("ok", 0, t, Send("t", value, 0, None, True, i)))
        if i == 5:
            events.append(Event("invoke", "nemesis", t, Nemesis("kill-leader", "start")))
            events.append(Event("ok", "nemesis", t, Nemesis("kill-leader", "start", ("n1",))))
        if i == 9:
            events.append(Event("invoke", "nemesis", t, Nemesis("kill-leader", "stop")))
            events.append(Event("ok", "nemesis", t, Nemesis("kill-leader", "stop", ("n1",))))
    reads = tuple(Read("t", 0, i, f"p0-{i}") for i in range(20) if not (lose and i == 7))
    events.append(Event("invoke", "final", t, FinalRead((TP("t", 0),))))
    events.append(Event("ok", "final", t + 1, FinalRead((TP("t", 0),), reads)))
    write_history(path, events)


def test_a_valid_run_reports_valid_with_plots(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    _history(history, lose=False)
    result = check_file(history)
    page = Path(write_report(str(tmp_path), str(history), result, "settings", ["did things"]))
    text = page.read_text()
    assert result.valid and "<h1" in text and ">VALID<" in text
    assert "kill-leader" in text and "did things" in text
    for png in ("throughput.png", "latency.png", "unavailability.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")


def test_a_lost_write_makes_the_report_invalid_and_names_its_lines(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    _history(history, lose=True)
    result = check_file(history)
    text = Path(write_report(str(tmp_path), str(history), result, "settings")).read_text()
    assert not result.valid and result.lost == 1
    assert ">INVALID<" in text and "p0-7" in text
    assert "RESULT valid=0" in text


def test_the_unsafe_broker_flag_is_hidden_from_help() -> None:
    parser = build_parser()
    args = parser.parse_args(["jepsen", "--unsafe-ack-before-commit", "--time", "1"])
    assert args.unsafe_ack_before_commit
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    help_text = sub.choices["jepsen"].format_help()
    assert "--nemesis" in help_text and "unsafe" not in help_text
