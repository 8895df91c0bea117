"""The line protocol through the system's ``telnet`` client (issue 37), as a person pipes it.

``telnet`` turns a typed CR into ``CR NUL`` and a LF into ``CR LF`` (RFC 854); what the broker
stores and answers is checked over a real cluster (``broker_cluster``).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import EndReply, ErrorCode, ErrorReply

from .line_client import LineClient

pytestmark = pytest.mark.skipif(shutil.which("telnet") is None, reason="needs the telnet client")


def piped_telnet(
    address: tuple[str, int], text: bytes, answers: int, limit_s: float = 10.0
) -> tuple[str, bool]:
    """``printf TEXT | telnet HOST PORT`` until ``answers`` reply lines (+OK/-ERR) came back or
    the broker closed the connection; returns what telnet printed and whether it was closed."""
    host, port = address
    proc = subprocess.Popen(
        ["telnet", host, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(text)
        proc.stdin.flush()
        out = b""
        closed = False
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    closed = True
                    break
                out += chunk
            lines = out.decode("utf-8", "replace").splitlines()
            if sum(1 for line in lines if line.startswith(("+OK", "-ERR"))) >= answers:
                break
        return out.decode("utf-8", "replace"), closed
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(5)


def test_piped_telnet_line_endings_store_what_was_typed(broker_cluster: LocalCluster) -> None:
    address = broker_cluster.client_address(0)
    with LineClient(address) as c:
        c.ok("CREATE nvt 1 3")
    out, _ = piped_telnet(address, b"PUBS nvt x\r\nPING\r\n", answers=2)
    replies = [line for line in out.splitlines() if line.startswith(("+OK", "-ERR"))]
    assert len(replies) == 2 and all(r.startswith("+OK") for r in replies), out
    with LineClient(address) as c:
        rows = c.rows("FETCH nvt 0 0 format=text")
    values = [getattr(r, "value", None) for r in rows if getattr(r, "value", None) is not None]
    assert values == [b"x"]


def test_exit_and_quit_both_end_a_telnet_session(broker_cluster: LocalCluster) -> None:
    address = broker_cluster.client_address(1)
    for word in (b"exit", b"quit", b"EXIT"):
        out, closed = piped_telnet(address, word + b"\r\nPING\r\n", answers=2, limit_s=5)
        assert "+OK bye" in out and "PONG" not in out and closed, (word, out)


def test_cons_names_a_partition_the_topic_lacks(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(2)) as c:
        c.ok("CREATE narrow 2 3")
        sub = c.ok("SUBS narrow readers")
        missing = c.call(f"CONS narrow {sub} 7:0")
        still = c.rows(f"CONS narrow {sub} 0:0")
    assert isinstance(missing, ErrorReply) and missing.code is ErrorCode.UNKNOWN_PARTITION
    assert "has no partition 7" in missing.message and "rebalance" not in missing.message
    assert isinstance(still[-1], EndReply)
