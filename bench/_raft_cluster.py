"""A cluster of ``bench._raft_node`` processes on loopback, for tests and benchmarks.

``RaftCluster`` starts N node processes, talks to their control ports, kills (SIGKILL) and
restarts them, and always stops every process it started (use it as a context manager).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from kafkaesque.local_cluster import free_ports


class RaftCluster:
    def __init__(
        self, root: Path, nodes: int = 3, groups: int = 1, extra_args: list[str] | None = None
    ) -> None:
        self.extra_args = extra_args or []
        self.root = root
        self.n = nodes
        self.groups = groups
        ports = free_ports(2 * nodes)
        self.peer_ports = ports[:nodes]
        self.control_ports = ports[nodes:]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> RaftCluster:
        try:
            for i in range(self.n):  # all at once: elections need the peers up together
                self.start(i, wait=False)
            for i in range(self.n):
                self._wait_ready(i)
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def start(self, i: int, *, wait: bool = True) -> None:
        """Start node ``i``; with ``wait``, until its control port answers."""
        peers = ",".join(f"{j}=127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        cmd = [
            sys.executable,
            "-m",
            "bench._raft_node",
            "--id",
            str(i),
            "--peers",
            peers,
            "--control",
            str(self.control_ports[i]),
            "--data",
            str(self.root / f"node{i}"),
            "--groups",
            str(self.groups),
            *self.extra_args,
        ]
        repo = Path(__file__).resolve().parent.parent
        self.procs[i] = subprocess.Popen(cmd, cwd=repo, stdin=subprocess.DEVNULL)
        if wait:
            self._wait_ready(i)

    def _wait_ready(self, i: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.request(i, {"op": "status"}, timeout=1)
                return
            except OSError:
                if self.procs[i].poll() is not None:
                    raise RuntimeError(f"node {i} exited with {self.procs[i].returncode}") from None
                time.sleep(0.05)
        raise RuntimeError(f"node {i} did not answer on its control port")

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (no clean shutdown: a crash)."""
        proc = self.procs.pop(i)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.kill(i)

    def alive(self) -> list[int]:
        return sorted(self.procs)

    def request(self, i: int, req: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.control_ports[i]), timeout=timeout) as s:
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError(f"node {i} closed the control connection")
                buf += chunk
        reply: dict[str, Any] = json.loads(buf)
        return reply

    def leader(self, group: str, timeout: float = 10) -> int:
        """The alive node that leads ``group`` (waits until exactly one does)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = []
            for i in self.alive():
                try:
                    if self.request(i, {"op": "status"}, timeout=2)["role"][group] == "leader":
                        leaders.append(i)
                except OSError:
                    pass
            if len(leaders) == 1:
                return leaders[0]
            time.sleep(0.02)
        raise TimeoutError(f"no single leader for {group}")

    def propose(self, group: str, value: str, timeout: float = 10) -> int:
        """Propose through whoever leads now, retrying until committed; return the offset."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in self.alive():
                try:
                    reply = self.request(i, {"op": "propose", "group": group, "value": value}, 5)
                except OSError:
                    continue
                if reply.get("ok"):
                    return int(reply["offset"])
            time.sleep(0.01)
        raise TimeoutError(f"could not commit {value!r} to {group}")

    def cpu_seconds(self, i: int) -> float:
        """User + system CPU time of node ``i`` so far (from /proc)."""
        with open(f"/proc/{self.procs[i].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
