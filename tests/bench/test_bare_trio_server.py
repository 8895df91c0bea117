"""The floors of ``bench.conn_memory`` (``bench/_bare_trio_server.py``): each mode holds idle
connections and lets go of each one its peer closes, parked ones included."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from bench._mqtt_procs import open_files

CONNECTIONS = 40


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in 10 s: {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("mode", ["task", "pair", "parked"])
def test_a_bare_server_holds_idle_connections_and_closes_those_its_peers_close(
    mode: str,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._bare_trio_server", mode], stdout=subprocess.PIPE, text=True
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.2)
        files = open_files(proc.pid)
        for _ in range(CONNECTIONS):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        _until(lambda: open_files(proc.pid) == files + CONNECTIONS, "every connection held")
        for s in socks[: CONNECTIONS // 2]:
            s.sendall(b"ignored")  # read and dropped: the connection stays
        time.sleep(0.2)
        assert open_files(proc.pid) == files + CONNECTIONS
        for s in socks[: CONNECTIONS // 2]:
            s.close()
        _until(lambda: open_files(proc.pid) == files + CONNECTIONS // 2, "closed ones let go")
        assert proc.poll() is None
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()
