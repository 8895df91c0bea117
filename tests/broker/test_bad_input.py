"""Bad input gets a clear error or a closed connection, and everyone else is still served."""

from __future__ import annotations

import socket
import time

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import ErrorCode, ErrorReply

from .line_client import LineClient


def test_a_client_that_stalls_mid_line_blocks_no_one(broker_cluster: LocalCluster) -> None:
    address = broker_cluster.client_address(0)
    with LineClient(address) as staller, LineClient(address) as other:
        other.ok("CREATE stall 1 3")
        staller.send("PUBS stall half a li")
        for _ in range(20):
            assert other.ok("PING") == "PONG"
        other.ok("PUBS stall from the other client")
        staller.send("ne\r\n")
        assert staller.answer() is not None
        rows = other.rows("FETCH stall 0 0 format=text")
    values = [getattr(r, "value", None) for r in rows]
    assert b"half a line" in values and b"from the other client" in values


def test_oversized_lines_and_payloads_are_refused_and_skipped(
    broker_cluster: LocalCluster,
) -> None:
    with LineClient(broker_cluster.client_address(1)) as c:
        c.ok("CREATE big 1 3")
        c.send(b"PUBS big " + b"x" * 200_000 + b"\r\n")
        too_long = c.answer()
        c.send(b"PUB big bytes=%d\r\n" % (9 << 20))
        too_big = c.answer()
        c.send(b"y" * (9 << 20) + b"\r\n")  # skipped as it arrives
        assert c.ok("PING") == "PONG"
        assert c.ok("PUBS big small") == "0 1"
    for reply in (too_long, too_big):
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TOO_LARGE


def test_a_framing_error_closes_only_that_connection(broker_cluster: LocalCluster) -> None:
    address = broker_cluster.client_address(2)
    with LineClient(address) as bad, LineClient(address) as good:
        bad.send(b"PUBB t 0 lots\r\n")
        reply = bad.answer()
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BAD_ARGS
        bad.sock.settimeout(10)
        assert bad.sock.recv(100) == b""  # the broker hung up
        assert good.ok("PING") == "PONG"


def test_ten_thousand_connections_opened_and_dropped(broker_cluster: LocalCluster) -> None:
    address = broker_cluster.client_address(0)
    deadline = time.monotonic() + 120
    opened = 0
    while opened < 10_000 and time.monotonic() < deadline:
        wave = []
        for i in range(250):
            s = socket.create_connection(address, timeout=10)
            if i % 3 == 0:
                s.sendall(b"PUBS half")  # some leave half a line behind
            elif i % 3 == 1:
                s.sendall(b"PING\r\n")
            wave.append(s)
        for s in wave:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # an abortive close (RST) for the harshest case
        opened += len(wave)
    assert opened == 10_000
    with LineClient(address) as c:
        assert c.ok("PING") == "PONG"
        rows = c.rows("METADATA")
    assert len(rows) >= 4  # three brokers and the end


def test_telnet_bytes_are_never_silently_altered(broker_cluster: LocalCluster) -> None:
    with LineClient(broker_cluster.client_address(1)) as c:
        c.ok("CREATE telnet-bytes 1 3")
        # A raw client's first telnet command is refused, saying so (issue 37): nothing vanishes.
        raw = c.call(b"PUBS telnet-bytes a\xff\xf1b")
        # Then telnet mode: IAC IAC is one data byte 0xFF; negotiation (Ctrl-C: IAC IP, IAC DO
        # TIMING-MARK) goes.
        escaped = c.ok(b"PUBS telnet-bytes a\xff\xffb\xff\xf4\xff\xfd\x06c")
        lone = c.call(b"PUBS telnet-bytes a\xffb")
        topic = c.call(b"PUBS or\xffders x")
        doubled_topic = c.call(b"PUBS or\xff\xffders x")
        rows = c.rows("FETCH telnet-bytes 0 0 format=text")
        listed = c.rows("LIST")
    assert isinstance(raw, ErrorReply) and raw.code is ErrorCode.BAD_ARGS
    assert "are a telnet command" in raw.message and "from now on" in raw.message
    assert escaped.split()[0] == "0"
    assert [getattr(r, "value", None) for r in rows[:-1]] == [b"a\xffbc"]
    for reply in (lone, topic):
        assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.BAD_ARGS
        assert "telnet IAC" in reply.message
    assert isinstance(doubled_topic, ErrorReply) and doubled_topic.code is ErrorCode.INVALID_TOPIC
    assert not any("orers" in str(r) or "ders" in str(r) for r in listed)
