"""The peer wire format, sans I/O: frames of msgpack and the authentication handshake.

A frame is ``length (uint32) | crc32c (uint32) | payload`` (big-endian), where the payload is one
msgpack value and the CRC covers the payload. Between two brokers, the first three frames are the
handshake; every later frame holds a list of items (the Raft messages of many groups).

Handshake (challenge-response on a shared cluster secret; the secret never crosses the wire):

1. dialer → acceptor  ``{"t": "hello", "cluster": name, "from": id, "to": id, "nonce": 16 B}``
2. acceptor → dialer  ``{"t": "challenge", "from": id, "nonce": 16 B, "mac": HMAC("acceptor")}``
3. dialer → acceptor  ``{"t": "proof", "mac": HMAC("dialer")}``

where ``HMAC(role) = HMAC-SHA256(secret, role | cluster | dialer id | acceptor id | dialer nonce |
acceptor nonce)``. Each side proves it holds the secret and is fresh (the other side's nonce), so a
replayed or forged handshake fails. Frames after it are not MACed (that would cost a keyed hash
per byte replicated): the threat model is a peer network that strangers can connect to, not one
where they can inject into an established TCP stream. A frame that is malformed (bad length or CRC,
not msgpack, wrong shape) is a ``PeerProtocolError``: the connection is closed and the event logged.
"""

from __future__ import annotations

import hmac
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from crc32c import crc32c

_FRAME = struct.Struct(">II")
FRAME_HEADER = _FRAME.size
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
NONCE_BYTES = 16


class PeerProtocolError(Exception):
    """The peer sent something that breaks the wire protocol; close the connection."""


class AuthenticationError(PeerProtocolError):
    """The peer does not know the cluster secret, or is not who it claims to be."""


def encode_frame(value: Any) -> bytes:
    payload: bytes = msgpack.packb(value, use_bin_type=True)
    return _FRAME.pack(len(payload), crc32c(payload)) + payload


# Below this payload size a frame goes out as one joined buffer (one send); above it the header
# and the payload go separately, so the payload is never copied just to prepend 8 bytes.
_JOIN_BELOW = 64 * 1024
# A buffer grown past this by one huge frame is dropped after it, not kept for the next ones.
_KEEP_BUFFER_BYTES = 16 * 1024 * 1024
# Items queued together go out in frames of about this size, not one frame of everything.
FRAME_TARGET_BYTES = 256 * 1024


class FrameEncoder:
    """Encodes lists of items as frames, into one reused buffer and in pieces.

    Replicating a megabyte through ``encode_frame`` costs three copies of it in fresh memory
    (msgpack's buffer, the ``bytes`` made of it, the header prepended); fresh large allocations
    also page-fault on first touch. Here a payload stays in the packer's buffer, which the next
    frame reuses. And a long queue of items becomes several frames of about ``target`` bytes, so
    the peer starts on the first (a follower writes and acknowledges the first AppendEntries)
    while the rest are encoded and sent: replication flows instead of advancing in lock-step.
    Not thread-safe; one per connection.
    """

    def __init__(self, target: int = FRAME_TARGET_BYTES) -> None:
        self._target = target
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        self._head = msgpack.Packer()
        self._view: memoryview | None = None

    def frames(self, items: Sequence[Any]) -> Iterator[list[bytes | memoryview]]:
        """The frames of ``items`` (in order, each a list of items), as buffers to send in order.

        A frame closes once it holds ``target`` bytes (or the items run out); it always holds at
        least one item. The buffers of a frame stay valid until the next frame is taken or
        ``release`` is called, which reuse their memory.
        """
        i, n, target = 0, len(items), self._target
        while i < n:
            if self._view is not None:  # (tested here: most frames are small, and never held)
                self.release()
            packer, count = self._packer, 0
            while True:
                packer.pack(items[i])
                i += 1
                count += 1
                if i == n:
                    break  # the last item: no need to measure the frame
                with packer.getbuffer() as view:
                    if len(view) >= target:
                        break
            yield self._frame(count)

    def _frame(self, count: int) -> list[bytes | memoryview]:
        head: bytes = self._head.pack_array_header(count)
        view = self._packer.getbuffer()
        size = len(view)
        header = _FRAME.pack(len(head) + size, crc32c(view, crc32c(head))) + head
        if size < _JOIN_BELOW:
            frame = header + bytes(view)
            view.release()
            self._packer.reset()
            return [frame]
        self._view = view
        return [header, view]

    def release(self) -> None:
        """Give the buffer of the last frame back (after it was sent, or abandoned)."""
        if self._view is not None:
            size = len(self._view)
            self._view.release()
            self._view = None
            if size > _KEEP_BUFFER_BYTES:
                self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)
            else:
                self._packer.reset()


class FrameDecoder:
    """Feed bytes, take whole decoded frames. Never buffers more than one max-size frame."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Add ``data``; return the values of the frames it completed (maybe none).

        Raises ``PeerProtocolError`` for a frame over the limit (before its payload arrives),
        a CRC mismatch, or a payload that is not one msgpack value.
        """
        buf = self._buf
        buf += data
        out: list[Any] = []
        pos = 0
        size = len(buf)  # the buffer is only resized after the loop
        # Payloads are checked and unpacked in place (through a view of the frame): copying a
        # frame of replicated batches out of the buffer first would cost as much as unpacking
        # it. Each view is released before the buffer is resized.
        while size - pos >= FRAME_HEADER:
            length, want_crc = _FRAME.unpack_from(buf, pos)
            if length > self._max_frame:
                raise PeerProtocolError(f"frame of {length} bytes over the {self._max_frame} limit")
            end = pos + FRAME_HEADER + length
            if end > size:
                break
            with memoryview(buf)[pos + FRAME_HEADER : end] as payload:
                if crc32c(payload) != want_crc:
                    raise PeerProtocolError("frame CRC mismatch")
                try:
                    out.append(msgpack.unpackb(payload, raw=False, strict_map_key=False))
                except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
                    raise PeerProtocolError(f"frame payload is not msgpack: {exc}") from exc
            pos = end
        del buf[:pos]
        return out


@dataclass(frozen=True, slots=True)
class Hello:
    cluster: str
    dialer: int
    acceptor: int
    nonce: bytes


def _mac(secret: bytes, role: bytes, hello: Hello, acceptor_nonce: bytes) -> bytes:
    message = b"|".join(
        [
            role,
            hello.cluster.encode(),
            str(hello.dialer).encode(),
            str(hello.acceptor).encode(),
            hello.nonce,
            acceptor_nonce,
        ]
    )
    return hmac.new(secret, message, "sha256").digest()


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def hello_frame(hello: Hello) -> bytes:
    return encode_frame(
        {
            "t": "hello",
            "cluster": hello.cluster,
            "from": hello.dialer,
            "to": hello.acceptor,
            "nonce": hello.nonce,
        }
    )


def parse_hello(value: Any, cluster: str, my_id: int) -> Hello:
    """Check the first frame an acceptor receives. Raises ``AuthenticationError``."""
    if not isinstance(value, dict) or value.get("t") != "hello":
        raise AuthenticationError("expected a hello frame")
    try:
        hello = Hello(
            str(value["cluster"]), int(value["from"]), int(value["to"]), bytes(value["nonce"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AuthenticationError(f"malformed hello: {exc}") from exc
    if hello.cluster != cluster:
        raise AuthenticationError(f"peer is in cluster {hello.cluster!r}, not {cluster!r}")
    if hello.acceptor != my_id:
        raise AuthenticationError(f"peer wanted node {hello.acceptor}, this is node {my_id}")
    if len(hello.nonce) != NONCE_BYTES:
        raise AuthenticationError("bad nonce")
    return hello


def challenge_frame(secret: bytes, hello: Hello, acceptor_nonce: bytes) -> bytes:
    return encode_frame(
        {
            "t": "challenge",
            "from": hello.acceptor,
            "nonce": acceptor_nonce,
            "mac": _mac(secret, b"acceptor", hello, acceptor_nonce),
        }
    )


def check_challenge(value: Any, secret: bytes, hello: Hello) -> bytes:
    """The dialer checks the acceptor's proof; returns the acceptor's nonce."""
    if not isinstance(value, dict) or value.get("t") != "challenge":
        raise AuthenticationError("expected a challenge frame")
    try:
        nonce, mac, sender = bytes(value["nonce"]), bytes(value["mac"]), int(value["from"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AuthenticationError(f"malformed challenge: {exc}") from exc
    if sender != hello.acceptor:
        raise AuthenticationError(f"node {sender} answered for node {hello.acceptor}")
    if not hmac.compare_digest(mac, _mac(secret, b"acceptor", hello, nonce)):
        raise AuthenticationError("the acceptor does not know the cluster secret")
    return nonce


def proof_frame(secret: bytes, hello: Hello, acceptor_nonce: bytes) -> bytes:
    return encode_frame({"t": "proof", "mac": _mac(secret, b"dialer", hello, acceptor_nonce)})


def check_proof(value: Any, secret: bytes, hello: Hello, acceptor_nonce: bytes) -> None:
    if not isinstance(value, dict) or value.get("t") != "proof":
        raise AuthenticationError("expected a proof frame")
    mac = value.get("mac")
    if not isinstance(mac, bytes) or not hmac.compare_digest(
        mac, _mac(secret, b"dialer", hello, acceptor_nonce)
    ):
        raise AuthenticationError("the dialer does not know the cluster secret")
