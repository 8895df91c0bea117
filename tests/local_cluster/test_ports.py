"""``free_ports``: ports a broker can bind a moment later, while other connections come and go."""

from __future__ import annotations

import socket

import pytest

from kafkaesque.local_cluster import _launcher, free_ports


def test_ports_are_distinct_bindable_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    low = _launcher._ephemeral_start()
    if low is None or low - _launcher._PORT_POOL < 1024:
        pytest.skip("no ephemeral range to stay below on this machine")
    seen: set[int] = set()
    for _ in range(50):
        ports = free_ports(9)
        assert len(set(ports)) == 9
        assert all(low - _launcher._PORT_POOL <= p < low for p in ports)
        assert not seen & set(ports)  # a caller may ask again before it binds what it got
        seen |= set(ports)
        for port in ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        # A pool of exactly two ports, one of them taken: the other is the only answer.
        monkeypatch.setattr(_launcher, "_ephemeral_start", lambda: port + 1)
        monkeypatch.setattr(_launcher, "_PORT_POOL", 2)
        monkeypatch.setattr(_launcher, "_handed_out", set())
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port - 1))
            except OSError:
                pytest.skip("the port below the kernel's choice is in use")
        assert free_ports(1) == [port - 1]
        with pytest.raises(OSError, match="no 2 free ports"):
            free_ports(2)
