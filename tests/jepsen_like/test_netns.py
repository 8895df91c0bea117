"""Namespaces of a run: each node reachable at its own address, cuts by routes, nothing left.

Needs root and iproute2 (skipped otherwise). Real namespaces, real sockets.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafkaesque.jepsen_like._netns import NAME_PREFIX, NetnsNetwork, netns_available

pytestmark = pytest.mark.skipif(not netns_available(), reason="needs root and iproute2")

_SERVE = (
    "import socket,sys\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind((sys.argv[1],7000));s.listen();print('up',flush=True)\n"
    "while True:\n c,_=s.accept();c.close()\n"
)
_PROBE = "import socket,sys;socket.create_connection((sys.argv[1],7000),timeout=2)"


def _reaches(prefix: list[str], address: str) -> bool:
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", _PROBE, address], capture_output=True, check=False
    )
    return probe.returncode == 0


def _leftovers() -> str:
    names = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    mine = str(NetnsNetwork(1).tag)
    return "\n".join(
        line
        for line in (names + links).splitlines()
        if f"{NAME_PREFIX}-{mine}-" in line or f"{NAME_PREFIX}{mine}" in line
    )


def test_nodes_talk_until_a_route_cuts_one_way_and_cleanup_removes_everything() -> None:
    with NetnsNetwork(2) as net:
        server = subprocess.Popen(
            [*net.exec_prefix(1), sys.executable, "-c", _SERVE, net.address(1)],
            stdout=subprocess.PIPE,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"up"
            assert _reaches(net.exec_prefix(0), net.address(1))
            assert _reaches([], net.address(1))  # the harness, in the root namespace
            net.cut(0, 1)
            assert not _reaches(net.exec_prefix(0), net.address(1))
            assert _reaches([], net.address(1))  # only node 0's route is cut
            net.heal()
            assert _reaches(net.exec_prefix(0), net.address(1))
        finally:
            server.kill()
            server.wait()
    assert _leftovers() == ""
