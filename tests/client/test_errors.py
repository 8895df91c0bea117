"""The client's errors say what happened in plain words."""

from __future__ import annotations

import errno
import os
import re
import socket
import struct

import pytest
import trio

from kafkaesque.client import KafkaesqueConnectionError, SyncConnection
from kafkaesque.client._errors import os_reason
from kafkaesque.protocol import Ping


def test_a_socket_error_reads_as_words_not_as_a_repr() -> None:
    assert os_reason(OSError(errno.EPIPE, os.strerror(errno.EPIPE))) == "Broken pipe"
    assert os_reason(trio.BrokenResourceError()) == "BrokenResourceError"  # no text at all
    assert os_reason(ValueError("bad value")) == "bad value"


def test_a_reset_connection_says_so_without_an_errno() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with SyncConnection(server.getsockname()) as connection:
            peer, _ = server.accept()
            # Linger 0: close sends a RST, so the client's read fails with ECONNRESET.
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.send(Ping())
            peer.close()
            with pytest.raises(KafkaesqueConnectionError) as info:
                connection.request(Ping(), 5.0)
    message = str(info.value)
    # Which of the two the kernel reports depends on whether the RST came before the send.
    said = r"(sending|receiving) failed: (Connection reset by peer|Broken pipe)$"
    assert re.search(said, message), message
    assert "[Errno" not in message and "send to" not in message and "receive from" not in message
