"""The peer wire format: frames survive any split, lies are caught, the handshake authenticates."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
import pytest
from hypothesis import given

from kafkaesque.raft.driver._wire import (
    AuthenticationError,
    FrameDecoder,
    FrameEncoder,
    Hello,
    PeerProtocolError,
    challenge_frame,
    check_challenge,
    check_proof,
    encode_frame,
    hello_frame,
    new_nonce,
    parse_hello,
    proof_frame,
)

values = st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=50) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=20,
)


@given(frames=st.lists(values, min_size=1, max_size=8), data=st.data())
def test_frames_round_trip_whatever_the_split(frames: list[object], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(v) for v in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    got: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got.extend(decoder.feed(stream[a:b]))
    assert got == frames


@given(
    batches=st.lists(st.lists(values | st.just(b"\x07" * 70_000), max_size=6), max_size=4),
    target=st.sampled_from([1, 100, 1 << 20]),
)
def test_the_reusing_encoder_frames_any_items(batches: list[list[object]], target: int) -> None:
    # Small frames come as one buffer, large ones as header + a view of the reused buffer; a
    # list of items comes out as frames of about ``target`` bytes, each a list of items, in
    # order; each frame's buffers are read before the next is taken.
    encoder = FrameEncoder(target)
    decoder = FrameDecoder()
    for items in batches:
        frames = []
        for frame in encoder.frames(items):
            data = b"".join(bytes(p) for p in frame)
            frames.extend(decoder.feed(data))
        assert [item for frame in frames for item in frame] == items
        assert all(frames)
        if target == 1:
            assert len(frames) == len(items)
        if target == 1 << 20 and items:
            assert frames == [items]
            assert data == encode_frame(items)
    encoder.release()
    encoder.release()  # idempotent


def test_a_decoder_keeps_working_after_large_frames_split_anywhere() -> None:
    # The decoder unpacks through a view of its buffer and must release it before it trims the
    # buffer (a BufferError otherwise): feed large frames in pieces, then small ones.
    big = [b"\x01" * 300_000, b"\x02" * 5]
    stream = encode_frame(big) + encode_frame([1]) + encode_frame(big)
    decoder = FrameDecoder()
    got: list[object] = []
    for i in range(0, len(stream), 65_537):
        got.extend(decoder.feed(stream[i : i + 65_537]))
    assert got == [big, [1], big]


def test_a_frame_over_the_limit_is_refused_before_its_payload() -> None:
    decoder = FrameDecoder(max_frame=1000)
    with pytest.raises(PeerProtocolError, match="limit"):
        decoder.feed(struct.pack(">II", 1_000_000, 0))


def test_a_corrupt_frame_is_refused() -> None:
    frame = bytearray(encode_frame([1, 2, 3]))
    frame[-1] ^= 1
    with pytest.raises(PeerProtocolError, match="CRC"):
        FrameDecoder().feed(bytes(frame))


def test_a_payload_that_is_not_msgpack_is_refused() -> None:
    from crc32c import crc32c

    payload = b"\xc1"  # never used in msgpack
    with pytest.raises(PeerProtocolError, match="msgpack"):
        FrameDecoder().feed(struct.pack(">II", len(payload), crc32c(payload)) + payload)


def _handshake(dialer_secret: bytes, acceptor_secret: bytes) -> None:
    hello = Hello("c1", 1, 2, new_nonce())
    parsed = parse_hello(FrameDecoder().feed(hello_frame(hello))[0], "c1", 2)
    nonce = new_nonce()
    challenge = FrameDecoder().feed(challenge_frame(acceptor_secret, parsed, nonce))[0]
    got_nonce = check_challenge(challenge, dialer_secret, hello)
    proof = FrameDecoder().feed(proof_frame(dialer_secret, hello, got_nonce))[0]
    check_proof(proof, acceptor_secret, parsed, nonce)


def test_the_handshake_succeeds_with_the_same_secret() -> None:
    _handshake(b"s3cret", b"s3cret")


def test_the_handshake_fails_when_either_side_lacks_the_secret() -> None:
    with pytest.raises(AuthenticationError, match="acceptor does not know"):
        _handshake(b"s3cret", b"guess")


def test_a_proof_cannot_be_replayed_against_a_new_challenge() -> None:
    secret = b"s3cret"
    hello = Hello("c1", 1, 2, new_nonce())
    first = new_nonce()
    old_proof = FrameDecoder().feed(proof_frame(secret, hello, first))[0]
    with pytest.raises(AuthenticationError):
        check_proof(old_proof, secret, hello, new_nonce())


def test_a_hello_for_another_cluster_or_node_is_refused() -> None:
    frame = FrameDecoder().feed(hello_frame(Hello("other", 1, 2, new_nonce())))[0]
    with pytest.raises(AuthenticationError, match="cluster"):
        parse_hello(frame, "c1", 2)
    frame = FrameDecoder().feed(hello_frame(Hello("c1", 1, 3, new_nonce())))[0]
    with pytest.raises(AuthenticationError, match="node 3"):
        parse_hello(frame, "c1", 2)
