"""``bench._mqtt_procs``: the baseline mosquitto and the per-process measurements of bench.mqtt."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bench._mqtt_procs import (
    MOSQUITTO,
    Mosquitto,
    open_files,
    open_files_room,
    rss_kib,
    settle_open_files,
)


@pytest.mark.skipif(not os.path.exists(MOSQUITTO), reason="mosquitto is not installed")
def test_mosquitto_listens_until_the_block_ends(tmp_path: Path) -> None:
    with Mosquitto(tmp_path) as server:
        socket.create_connection(server.address, timeout=10).close()
        assert rss_kib(server.proc.pid) > 0
    assert server.proc.poll() is not None
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=10).close()


def test_open_files_room_counts_what_this_process_may_still_open() -> None:
    before = open_files_room(os.getpid())
    with open(__file__):  # held open on purpose
        assert open_files_room(os.getpid()) == before - 1
    settle_open_files(os.getpid(), at_most=open_files(os.getpid()))  # at once


def test_a_process_that_is_gone_has_no_memory() -> None:
    assert rss_kib(2**22 + 12345) == 0
