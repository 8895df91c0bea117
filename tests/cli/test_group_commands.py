"""``kafkaesque group list|describe|reset|delete`` as a user runs them, against real brokers, and
the parsing of their options."""

from __future__ import annotations

import argparse
import time

import pytest
from kafkaesque.cli.client_commands import _reset_target
from kafkaesque.cli.client_options import ClientCommandError
from kafkaesque.cli.main import build_parser

from kafkaesque.local_cluster import LocalCluster

from ..broker.line_client import LineClient
from .test_client_commands import ok, run


def _reset_args(*argv: str) -> argparse.Namespace:
    args: argparse.Namespace = build_parser(["group"]).parse_args(
        ["group", "reset", "g", "--topic", "t", *argv]
    )
    return args


def test_reset_options_parse_to_a_target() -> None:
    assert _reset_target(_reset_args("--to-earliest")) == ("earliest", None)
    assert _reset_target(_reset_args("--to-latest")) == ("latest", None)
    assert _reset_target(_reset_args("--to-offset", "42")) == ("offset", 42)
    assert _reset_target(_reset_args("--to-datetime", "1700000000000")) == ("time", 1700000000000)
    iso = _reset_target(_reset_args("--to-datetime", "2026-11-26T08:00:00Z"))
    assert iso == ("time", 1795680000000)
    with pytest.raises(ClientCommandError, match="--to-datetime 'soon'"):
        _reset_target(_reset_args("--to-datetime", "soon"))
    with pytest.raises(ClientCommandError, match="negative"):
        _reset_target(_reset_args("--to-offset", "-1"))
    with pytest.raises(SystemExit):  # exactly one --to-* (argparse says so on stderr)
        _reset_args("--to-earliest", "--to-latest")
    with pytest.raises(SystemExit):
        _reset_args()


def test_group_list_describe_reset_delete(broker_cluster: LocalCluster) -> None:
    ok(broker_cluster, "topic", "create", "cli-g", "--partitions", "2", "--replication-factor", "3")
    ok(broker_cluster, "produce", "cli-g", "--partition", "0", stdin=b"a\nb\nc\n")
    with LineClient(broker_cluster.client_address(0)) as member:
        sub = member.ok("SUBS cli-g auditors").split()[0]
        listed = ok(broker_cluster, "group", "list").splitlines()
        assert listed[0].split() == ["GROUP", "TOPIC", "STATE", "MEMBERS"]
        assert ["auditors", "cli-g", "Stable", "1"] in [line.split() for line in listed]
        described = ok(broker_cluster, "group", "describe", "auditors").splitlines()
        assert described[0] == "group auditors on cli-g: Stable, 1 member(s)"
        assert described[1].split() == ["MEMBER", "PARTITIONS"]
        assert described[2].split() == [sub, "0,1"]
        assert described[3].split() == ["PARTITION", "OWNER", "COMMITTED", "END", "LAG"]
        p0 = described[4].split()
        assert p0[:3] == ["0", sub, "-"] and int(p0[3]) >= 3 and p0[4] == p0[3]  # lag = end

        refused = run(
            broker_cluster, "group", "reset", "auditors", "--topic", "cli-g", "--to-latest"
        )
        assert refused.returncode != 0 and b"GROUP_NOT_EMPTY" in refused.stderr
        assert len(refused.stderr.decode().strip().splitlines()) == 1
    deadline = time.monotonic() + 20
    while "Empty" not in ok(broker_cluster, "group", "describe", "auditors", "--topic", "cli-g"):
        assert time.monotonic() < deadline, "the member never left"
        time.sleep(0.05)

    planned = run(broker_cluster, "group", "reset", "auditors", "--topic", "cli-g", "--to-latest")
    assert planned.returncode == 0 and b"add --execute to apply" in planned.stderr
    untouched = ok(broker_cluster, "group", "describe", "auditors").splitlines()
    assert untouched[2].split() == ["0", "-", "-", p0[3], p0[3]]  # the dry run changed nothing
    reset = ok(
        broker_cluster, "group", "reset", "auditors", "--topic", "cli-g", "--to-latest", "--execute"
    )
    rows = [line.split() for line in reset.splitlines()]
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "NEW_OFFSET"]
    assert rows[1][:3] == ["auditors", "cli-g", "0"] and int(rows[1][3]) == int(p0[3])
    assert planned.stdout.decode() == reset  # the plan was what --execute did
    after = ok(broker_cluster, "group", "describe", "auditors").splitlines()
    assert after[2].split() == ["0", "-", p0[3], p0[3], "0"]  # no member table, lag 0

    assert ok(broker_cluster, "group", "delete", "auditors").strip() == "deleted group auditors"
    gone = run(broker_cluster, "group", "describe", "auditors")
    assert gone.returncode != 0 and b"UNKNOWN_GROUP" in gone.stderr
    assert "auditors" not in ok(broker_cluster, "group", "list")
