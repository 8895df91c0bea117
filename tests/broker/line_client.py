"""A telnet-like test client: raw lines out, decoded replies in (one blocking socket).

Deliberately not the client library: these tests speak the protocol the way a person at a
telnet prompt does, byte for byte.
"""

from __future__ import annotations

import socket
from types import TracebackType

from kafkaesque.protocol import (
    NEED_DATA,
    DataReply,
    EndReply,
    ErrorReply,
    OkReply,
    Reply,
    ReplyDecoder,
)

Answer = Reply | list[Reply]  # a list reply is its rows and its closing EndReply


class LineClient:
    def __init__(self, address: tuple[str, int], timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.decoder = ReplyDecoder()

    def __enter__(self) -> LineClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def answer(self) -> Answer:
        """The next whole answer: one reply, or the rows of a list and its end."""
        rows: list[Reply] = []
        while True:
            event = self.decoder.next_event()
            if event is NEED_DATA:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                self.decoder.feed(data)
                continue
            if isinstance(event, OkReply | ErrorReply | DataReply) and not rows:
                return event
            rows.append(event)
            if isinstance(event, EndReply):
                return rows

    def call(self, line: bytes | str) -> Answer:
        text = line.encode() if isinstance(line, str) else line
        self.send(text + b"\r\n")
        return self.answer()

    def ok(self, line: bytes | str) -> str:
        """``call`` that must answer ``+OK``: its text."""
        reply = self.call(line)
        assert isinstance(reply, OkReply), f"{line!r} answered {reply!r}"
        return reply.text

    def rows(self, line: bytes | str) -> list[Reply]:
        reply = self.call(line)
        assert isinstance(reply, list), f"{line!r} answered {reply!r}"
        return reply
