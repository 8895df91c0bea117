"""``kafkaesque mqtt-bridge`` refuses bad arguments with one clear line and exit status 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafkaesque.cli.main import main
from kafkaesque.cli.mqtt_bridge import stats_line

from kafkaesque.mqtt_bridge import BridgeStats


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--upstream", "host:notaport"], "--upstream must be host:port"),
        (["--upstream", "h:1", "--rules", "/nonexistent/rules"], "--rules /nonexistent/rules"),
        (["--upstream", "h:1", "--converter", "avro"], "needs --avro-schema"),
        (["--upstream", "h:1", "--receive-maximum", "0"], "receive_maximum"),
        (["--upstream", "h:1", "--subscribe", "a/#/b"], "--subscribe 'a/#/b'"),
        (["--upstream", "h:1", "--share-group", "a/b"], "--share-group must be"),
        (["--upstream", "h:1", "--connections", "2"], "--connections above 1 needs"),
        (["--upstream", "h:1", "--share-group", "g", "--connections", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mqtt-bridge", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kafkaesque mqtt-bridge: ")
    assert message in err


def test_a_bad_rule_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules"
    rules.write_text("phones/+/spectrum -> readings key=1\nphones/# readings\n")
    assert main(["mqtt-bridge", "--upstream", "h:1", "--rules", str(rules)]) == 1
    assert "line 2" in capsys.readouterr().err


def test_the_counters_print_as_words_and_numbers() -> None:
    line = stats_line(BridgeStats(received=1200, appended=1200, dead_lettered=3))
    assert line.startswith("received 1,200, appended 1,200, acked 0, dead lettered 3, ")
    assert "BridgeStats" not in line and "=" not in line
