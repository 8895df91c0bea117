"""An open line-protocol connection keeps the group members it joined alive (issue 37, point 1).

A person at a telnet prompt sends no heartbeats: SUBS, CONS, think for longer than the session
timeout, CONS again must still work. The broker that holds the connection touches the members'
coordinator every third of its session timeout; the session timeout counts once that stops (the
broker died or was cut off), and stays for a member whose SUBS asked for its own
(``session_timeout_ms=``). Real brokers, raw sockets (``LineClient``), a short session timeout.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import time
from pathlib import Path

import trio

from kafkaesque.broker._broker import _keep_alive
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    EndReply,
    ErrorCode,
    ErrorReply,
    MemberRow,
    PartitionRow,
    partition_for_key,
)

from .line_client import Answer, LineClient

SESSION_S = 2.5  # touches every 0.83 s: two may be late by 0.8 s each on a loaded machine
# Idle this long: without the keep-alive an idle member is surely gone by then.
IDLE_S = 2 * SESSION_S
# Beyond a session: the expiry's tick and the eviction's write, on a loaded 2-core machine. Not a
# speed: a member kept alive by a dead broker would never go.
MARGIN_S = 15.0
TOPIC = "thinking"


# Answers that say "not now" (an election on a loaded machine), never "gone": asked again.
_RETRIABLE = {ErrorCode.NOT_LEADER, ErrorCode.TIMEOUT, ErrorCode.NOT_READY}


def _call(c: LineClient, line: str) -> Answer:
    """``c.call(line)``, asked again (for up to ``MARGIN_S``) while it answers a retriable error."""
    deadline = time.monotonic() + MARGIN_S
    while True:
        reply = c.call(line)
        if not (isinstance(reply, ErrorReply) and reply.code in _RETRIABLE):
            return reply
        assert time.monotonic() < deadline, f"{line!r} kept answering {reply}"
        time.sleep(0.2)


def _members(c: LineClient, group: str) -> set[str]:
    rows = _call(c, f"GROUPS {group} {TOPIC}")
    assert isinstance(rows, list), rows
    return {r.member for r in rows if isinstance(r, MemberRow)}


def _coordinator(c: LineClient, group: str) -> int:
    partition = partition_for_key(group.encode(), 8)
    rows = c.rows("METADATA __consumer_offsets")
    leader = next(
        r.leader for r in rows if isinstance(r, PartitionRow) and r.partition == partition
    )
    assert leader is not None
    return leader


def _reads(c: LineClient, member: str) -> bool:
    """Whether ``member`` still reads (CONS answers rows), else it is unknown (asserted)."""
    reply = _call(c, f"CONS {TOPIC} {member} 0")
    if isinstance(reply, list):
        assert isinstance(reply[-1], EndReply)
        return True
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.UNKNOWN_SUBSCRIPTION, reply
    return False


class _Telnet:
    """The system's ``telnet`` on a pipe, as a person types into it (None if not installed)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.proc = subprocess.Popen(
            ["telnet", address[0], str(address[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.out = b""

    def cons(self, member: str) -> str:
        """``CONS`` through ``member`` until it answers other than a retriable error."""
        deadline = time.monotonic() + MARGIN_S
        while True:
            answer = self.type(f"CONS {TOPIC} {member} 0", ("+END", "-ERR"))
            if not any(code.name in answer for code in _RETRIABLE):
                return answer
            assert time.monotonic() < deadline, answer
            time.sleep(0.2)

    def type(self, line: str, until: tuple[str, ...] = ("+OK", "-ERR")) -> str:
        """Type ``line``; the first output line after it that starts with one of ``until``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = b""
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for text in self.out.decode("utf-8", "replace").splitlines():
                if text.startswith(until):
                    return text
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"telnet ended: {self.out!r}"
                self.out += chunk
        raise AssertionError(f"no answer to {line!r}: {self.out!r}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def _gone_within(c: LineClient, group: str, member: str, bound_s: float) -> float:
    """Seconds until ``member`` is no longer in ``group`` (fails after ``bound_s``)."""
    start = time.monotonic()
    while member in _members(c, group):
        assert time.monotonic() - start < bound_s, f"{member} still in {group} after {bound_s} s"
        time.sleep(0.1)
    return time.monotonic() - start


def test_an_open_connection_keeps_its_members_and_the_session_counts_once_it_is_gone(
    tmp_path: Path,
) -> None:
    """Idle members on open connections stay (coordinated here and elsewhere); one that asked
    for its own timeout goes; a closed connection leaves at once; kill -9 of the broker holding
    a member expires it about one session later."""
    args = ["--session-timeout", str(SESSION_S)]
    with LocalCluster(str(tmp_path), 3, extra_args=args) as cluster:
        with LineClient(cluster.client_address(0)) as admin:
            admin.ok(f"CREATE {TOPIC} 3 3")
            admin.rows(f"OFFSETS idle {TOPIC}")  # creates __consumer_offsets
            coordinator = _coordinator(admin, "idle")
        holder = (coordinator + 1) % 3  # the broker whose connections hold the members
        other = (coordinator + 2) % 3
        far = LineClient(cluster.client_address(holder))  # its coordinator is elsewhere
        near = LineClient(cluster.client_address(coordinator))  # coordinated where it is held
        own = LineClient(cluster.client_address(holder))
        closing = LineClient(cluster.client_address(other))
        telnet = _Telnet(cluster.client_address(other)) if shutil.which("telnet") else None
        try:
            idle_far = far.ok(f"SUBS {TOPIC} idle")
            idle_near = near.ok(f"SUBS {TOPIC} idle")
            timed = own.ok(f"SUBS {TOPIC} timed session_timeout_ms=1000")
            leaving = closing.ok(f"SUBS {TOPIC} leaving session_timeout_ms=600000")
            assert _reads(far, idle_far) and _reads(near, idle_near) and _reads(own, timed)
            if telnet is not None:
                typed = telnet.type(f"SUBS {TOPIC} typed").split()
                assert typed[0] == "+OK", typed
                assert telnet.cons(typed[1]).startswith("+END")

            # A member whose connection closes leaves at once, not at its (ten minute) timeout.
            closing.close()
            with LineClient(cluster.client_address(coordinator)) as c:
                _gone_within(c, "leaving", leaving, MARGIN_S)

            time.sleep(IDLE_S)  # thinking, with nothing sent on any connection
            assert _reads(far, idle_far), "an idle member on an open connection was expired"
            assert _reads(near, idle_near)
            assert not _reads(own, timed), "a member with its own timeout was kept alive"
            if telnet is not None:  # the same through the system's telnet, as issue 37 tried it
                again = telnet.cons(typed[1])
                assert again.startswith("+END"), again

            # The broker that holds the connection dies: nobody touches the member any more.
            # (Its coordinator is elsewhere unless an election on a loaded machine moved it
            # there: then a new coordinator gives it one session, with the same outcome.)
            with LineClient(cluster.client_address(other)) as c:
                assert _members(c, "idle") == {idle_far, idle_near}
                cluster.kill(holder)
                _gone_within(c, "idle", idle_far, SESSION_S + MARGIN_S)
                assert _members(c, "idle") == {idle_near}
        finally:
            for c in (far, near, own, closing):
                c.close()
            if telnet is not None:
                telnet.close()


async def test_a_client_connection_that_vanishes_without_closing_is_probed_by_tcp_keepalive() -> (
    None
):
    """The connection is the liveness, so a client that vanished without a FIN (power lost)
    must not keep its members for ever: the broker's side of each client connection probes."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    accepted = await listener.accept()
    try:
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0  # by default
        _keep_alive(accepted)
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            idle = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
            probes = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            interval = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            assert idle + probes * interval <= 120  # gone within two minutes of silence
    finally:
        for s in (client, accepted, listener):
            await s.aclose()
