"""Telnet transcripts of the docs, replayed over a socket and compared line by line.

A transcript block starts with ``$ telnet <host> <port>``; then each line a person typed is
followed by the broker's reply lines (``+...`` or ``-ERR ...``). telnet's own chatter
(``Trying...``, ``Connected to...``, ``Escape character...``) is not the broker's;
``Connection closed by foreign host.`` says the broker closed the connection there.

Only what is random is normalized: the subscription id a ``SUBS`` answers (the documented one is
replaced by the real one in the commands that follow), and a partition's current leader
(``leader=<id>``: which replica wins an election depends on timing; the replicas, offsets and
everything else must be as documented).

A read of replicated state that is not served by the leader (``DESCRIBE``'s ``end=`` on a broker
that follows the partition) may show what the leader committed a heartbeat later: such reads
are asked again, for a few seconds, until they answer as documented.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from kafkaesque.protocol import encode_reply
from tests.broker.line_client import LineClient

_TELNET_CHATTER = ("Trying ", "Connected to ", "Escape character is ")
_CLOSED = "Connection closed by foreign host."
_LEADER = re.compile(r"\bleader=\S+")
_CONVERGING_READS = ("DESCRIBE", "METADATA", "LIST", "GROUPS", "OFFSETS")
_CONVERGE_S = 10.0


@dataclass(frozen=True)
class Step:
    line: int  # where the command is in the file
    command: str
    replies: tuple[str, ...]


@dataclass(frozen=True)
class Transcript:
    host: str
    port: int
    steps: tuple[Step, ...]
    closed_by_broker: bool = False


def parse(lines: tuple[str, ...], first_line: int) -> Transcript:
    """A transcript block's lines (``first_line``: the file line of ``lines[0]``)."""
    words = lines[0].split()
    if len(words) != 4 or words[:2] != ["$", "telnet"]:
        raise ValueError(f"line {first_line}: a transcript starts with '$ telnet <host> <port>'")
    steps: list[Step] = []
    closed = False
    command: tuple[int, str] | None = None
    replies: list[str] = []
    for k, line in enumerate(lines[1:], start=first_line + 1):
        if line.startswith(_TELNET_CHATTER) or not line.strip():
            continue
        if line == _CLOSED:
            closed = True
            continue
        if closed:
            raise ValueError(f"line {k}: text after the connection closed")
        if line.startswith(("+", "-ERR")):
            if command is None:
                raise ValueError(f"line {k}: a reply before any command")
            replies.append(line)
            continue
        if command is not None:
            steps.append(Step(command[0], command[1], tuple(replies)))
        command, replies = (k, line), []
    if command is not None:
        steps.append(Step(command[0], command[1], tuple(replies)))
    return Transcript(words[2], int(words[3]), tuple(steps), closed)


def replay(transcript: Transcript, address: tuple[str, int], timeout: float = 60.0) -> list[str]:
    """Type the transcript's commands at ``address``; the differences found (empty: none)."""
    problems: list[str] = []
    ids: dict[str, str] = {}  # documented subscription id -> the real one
    with LineClient(address, timeout=timeout) as client:
        for step in transcript.steps:
            command = step.command
            for documented, real in ids.items():
                command = command.replace(documented, real)
            expected = list(step.replies)
            got = _call(client, command)
            deadline = time.monotonic() + _CONVERGE_S
            while (
                _normalized(got) != _normalized(expected)
                and command.upper().startswith(_CONVERGING_READS)
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
                got = _call(client, command)
            if step.command.upper().startswith("SUBS ") and len(got) == len(expected) == 1:
                documented_id, real_id = expected[0].split()[-1], got[0].split()[-1]
                ids[documented_id] = real_id
                expected = [expected[0].replace(documented_id, real_id)]
            if _normalized(got) != _normalized(expected):
                problems.append(
                    f"line {step.line}: {step.command!r}\n  documented: {expected}\n"
                    f"  got:        {got}"
                )
        if transcript.closed_by_broker:
            client.sock.settimeout(timeout)
            if client.sock.recv(1) != b"":
                problems.append("the broker did not close the connection")
    return problems


def _call(client: LineClient, command: str) -> list[str]:
    """The reply lines to ``command`` as the broker sent them (without CRLF)."""
    answer = client.call(command)
    rows = answer if isinstance(answer, list) else [answer]
    return [
        text
        for row in rows
        for text in encode_reply(row).decode("utf-8", "replace").split("\r\n")
        if text
    ]


def _normalized(lines: list[str]) -> list[str]:
    return [_LEADER.sub("leader=*", line) for line in lines]
