"""Record a real telnet session against a running broker, for docs/protocol.md.

    bin/kafkaesque cluster up -n 3 &          # a local cluster (client port 9092 on broker 0)
    .venv/bin/python docs/record_transcript.py 127.0.0.1 9092 > transcript.txt

It runs the system's ``telnet`` in a pseudo-terminal (so typed lines are echoed as a person sees
them), types each command, waits for the broker's answer, and prints the screen as it was. The
subscription id that ``SUBS`` returns is pasted into ``CONS``, as a person would.
"""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time

SESSION = [
    "PING",
    "CREATE orders 3 3",
    "PUBS orders Hello World!",
    'PUBS orders {"Header": "h", "Key": "124", "Body": "Hello World!"}',
    "PUBS orders third message",
    "SUBS orders billing",
    "CONS orders {sub} 0",
    "PUB orders key=device-7 reading 42",
    "FETCH orders 0 0 format=text",
    "DESCRIBE orders",
    "PUBS greetings hello",
    "FETCH no-such-topic 0 0",
    "FROB",
    "HELP CONS",
    "QUIT",
]


def _read(fd: int, quiet_s: float = 0.5, limit_s: float = 10.0) -> bytes:
    """Whatever the terminal shows until it has been quiet for ``quiet_s``."""
    out = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], quiet_s)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the session ended (EIO on Linux)
            break
        if not chunk:
            break
        out += chunk
    return out


def main(host: str, port: str) -> int:
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("telnet", ["telnet", host, port])
    screen = _read(fd, quiet_s=1.0)
    sub = ""
    for line in SESSION:
        os.write(fd, line.replace("{sub}", sub).encode() + b"\r\n")
        answer = _read(fd)
        screen += answer
        if line.startswith("SUBS"):
            match = re.search(rb"\+OK (\S+)", answer)
            sub = match.group(1).decode() if match else "?"
    os.waitpid(pid, 0)
    text = screen.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "")
    sys.stdout.write(re.sub(r"\n\n+", "\n", text))  # the pty echoes each CRLF as two lines
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
