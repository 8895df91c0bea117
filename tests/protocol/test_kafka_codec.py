"""The Kafka codec: every API and version served round-trips through its schema (flexible
versions included), RecordBatch v2 round-trips with each codec, and bad bytes are a
``KafkaProtocolError``, never another exception."""

from __future__ import annotations

import contextlib
import gzip
import struct
from typing import Any

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    APIS,
    OFFSET_FOR_LEADER_EPOCH,
    Api,
    KafkaError,
    KafkaProtocolError,
    KafkaRecord,
    KafkaRequest,
    KafkaServerConnection,
    UnsupportedApiVersions,
    Writer,
    decode_batch,
    decode_response,
    encode_batch,
    encode_request,
    encode_response,
    iter_batches,
    parse_request,
)
from kafkaesque.protocol.kafka._group_apis import GROUP_APIS
from kafkaesque.protocol.kafka._schema import Array, Field, encode

_INTS = {"int8": 7, "int16": 15, "uint16": 16, "int32": 31, "int64": 63}


def value_of(f: Field, kind: str | Array, version: int) -> st.SearchStrategy[Any]:
    """Values of a field as the codec gives them back."""
    if isinstance(kind, Array):
        if isinstance(kind.of, str):
            element = value_of(Field(f.name, kind.of), kind.of, version)
        else:
            element = struct_of(kind.of, version)
        values = st.lists(element, max_size=3)
        return st.none() | values if f.nullable(version) else values
    if kind in _INTS:
        bits = _INTS[kind]
        if kind == "uint16":
            return st.integers(0, (1 << bits) - 1)
        return st.integers(-(1 << bits), (1 << bits) - 1)
    if kind == "bool":
        return st.booleans()
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind == "uuid":
        return st.binary(min_size=16, max_size=16)
    if kind == "string":
        text = st.text(max_size=20)
        return st.none() | text if f.nullable(version) else text
    data = st.binary(max_size=40)
    return st.none() | data if f.nullable(version) or kind == "records" else data


def struct_of(fields: tuple[Field, ...], version: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {f.name: value_of(f, f.kind, version) for f in fields if f.present(version)}
    )


def api_and_version() -> st.SearchStrategy[tuple[Api, int]]:
    return st.sampled_from(sorted(APIS.values(), key=lambda a: a.key)).flatmap(
        lambda api: st.tuples(st.just(api), st.integers(api.min_version, api.max_version))
    )


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the tagged-field sections the decoder adds."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "_tagged"}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(message)  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(api_and_version(), st.data())
def test_every_request_and_response_round_trips(which: tuple[Api, int], data: Any) -> None:
    api, version = which
    body = data.draw(struct_of(api.request.fields, version))
    frame = encode_request(api, version, 7, "client-1", body)
    request = parse_request(frame[4:])
    assert isinstance(request, KafkaRequest)
    assert (request.api, request.version, request.correlation_id) == (api, version, 7)
    assert request.client_id == "client-1"
    assert _plain(request.body) == body
    answer = data.draw(struct_of(api.response.fields, version))
    response = encode_response(request, answer)
    assert struct.unpack(">i", response[:4])[0] == len(response) - 4
    correlation_id, decoded = decode_response(api, version, response[4:])
    assert correlation_id == 7 and _plain(decoded) == answer


def test_an_api_versions_request_of_a_newer_version_gets_the_v0_answer_with_the_list() -> None:
    frame = encode_request(API_VERSIONS, 3, 1, "x", {})
    newer = bytearray(frame)
    struct.pack_into(">h", newer, 6, 9)  # ApiVersions v9, not served
    answer = parse_request(bytes(newer[4:]))
    assert isinstance(answer, UnsupportedApiVersions)
    _, body = decode_response(API_VERSIONS, 0, answer.response[4:])
    assert body["error_code"] == KafkaError.UNSUPPORTED_VERSION
    assert {k["api_key"] for k in body["api_keys"]} == set(APIS)


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">hhih", 99, 0, 1, -1),  # an unknown API key
        struct.pack(">hhih", 0, 42, 1, -1),  # Produce v42
        struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 1_000_000),  # an absurd array
        struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", -2),  # a negative length
        struct.pack(">hhih", 3, 1, 1, 5) + b"ab",  # a client id shorter than it says
    ],
)
def test_a_bad_request_is_a_protocol_error(frame: bytes) -> None:
    with pytest.raises(KafkaProtocolError):
        parse_request(frame)


def test_a_frame_larger_than_the_limit_is_refused_before_it_is_read() -> None:
    conn = KafkaServerConnection(max_request_bytes=1000)
    conn.feed(struct.pack(">i", 2000))
    with pytest.raises(KafkaProtocolError):
        conn.next_request()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_a_protocol_error(data: bytes) -> None:
    conn = KafkaServerConnection(max_request_bytes=10_000)
    conn.feed(struct.pack(">i", len(data)) + data)
    with contextlib.suppress(KafkaProtocolError):
        conn.next_request()


records = st.lists(
    st.tuples(
        st.integers(0, 1 << 45),
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=50),
        st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
    ),
    min_size=1,
    max_size=8,
).map(lambda rs: [KafkaRecord(i, t, k, v, tuple(h)) for i, (t, k, v, h) in enumerate(rs)])


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 1 << 40))
def test_a_record_batch_round_trips(rs: list[KafkaRecord], base: int) -> None:
    batch = encode_batch(base, rs, last_offset_delta=len(rs) - 1, leader_epoch=3)
    decoded = decode_batch(batch)
    assert decoded.base_offset == base and list(decoded.records) == rs
    assert [b.base_offset for b in iter_batches(batch + batch)] == [base, base]


def _compressed(batch: bytes, codec: int, compress: Any) -> bytes:
    """``batch`` with its records compressed by ``codec`` (header fixed up, CRC recomputed)."""
    from crc32c import crc32c

    head, body = bytearray(batch[:61]), bytes(compress(batch[61:]))
    struct.pack_into(">h", head, 21, codec)
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + body))
    return bytes(head) + body


@pytest.mark.parametrize(
    ("codec", "compress"),
    [
        (1, gzip.compress),
        (2, lambda b: bytes(cramjam.snappy.compress_raw(b))),
        (3, lambda b: bytes(cramjam.lz4.compress(b))),
        (4, lambda b: bytes(cramjam.zstd.compress(b))),
    ],
    ids=["gzip", "snappy", "lz4", "zstd"],
)
def test_each_compression_codec_is_read(codec: int, compress: Any) -> None:
    rs = [KafkaRecord(i, 1000 + i, b"k%d" % i, b"v" * 100, (("h", b"x"),)) for i in range(5)]
    batch = _compressed(encode_batch(0, rs, last_offset_delta=4), codec, compress)
    assert list(decode_batch(batch).records) == rs


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_a_batch_with_mangled_records_decodes_or_raises_a_protocol_error(
    rs: list[KafkaRecord], data: st.DataObject
) -> None:
    """Records cut, grown or overwritten under a valid CRC and count (a buggy or hostile
    producer): the record decoder refuses them with ``KafkaProtocolError``, nothing else."""
    from crc32c import crc32c

    batch = bytearray(encode_batch(0, rs, last_offset_delta=len(rs) - 1))
    body = batch[61:]
    start = data.draw(st.integers(0, len(body)))
    cut = data.draw(st.integers(start, len(body)))
    body[start:cut] = data.draw(st.binary(max_size=12))
    head = batch[:61]
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + bytes(body)))
    with contextlib.suppress(KafkaProtocolError):
        decode_batch(bytes(head + body))


@pytest.mark.parametrize("more", [1, 2])
def test_a_batch_counting_more_records_than_it_holds_is_refused(more: int) -> None:
    from crc32c import crc32c

    rs = [KafkaRecord(i, 1000 + i, None, b"v") for i in range(3)]
    batch = bytearray(encode_batch(0, rs, last_offset_delta=len(rs) - 1 + more))
    struct.pack_into(">i", batch, 57, len(rs) + more)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    with pytest.raises(KafkaProtocolError, match="truncated"):
        decode_batch(bytes(batch))


def test_a_batch_with_a_bad_crc_or_magic_is_refused() -> None:
    batch = bytearray(encode_batch(0, [KafkaRecord(0, 1, None, b"v")], last_offset_delta=0))
    batch[-1] ^= 1
    with pytest.raises(KafkaProtocolError, match="CRC"):
        decode_batch(bytes(batch))
    batch[-1] ^= 1
    batch[16] = 1  # magic 1
    with pytest.raises(KafkaProtocolError, match="magic"):
        decode_batch(bytes(batch))


def _kafka_python(api: Api, request: bool) -> Any:
    """kafka-python's class for ``api``'s request or response (its own schemas, from Kafka's)."""
    from kafka.protocol.admin import groups
    from kafka.protocol.consumer import group, offsets
    from kafka.protocol.metadata import find_coordinator

    name = api.name + ("Request" if request else "Response")
    for module in (group, groups, find_coordinator, offsets):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"kafka-python has no {name}")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([*GROUP_APIS, OFFSET_FOR_LEADER_EPOCH]), st.booleans(), st.data())
def test_kafka_python_reads_the_group_apis_bytes_and_writes_the_same(
    api: Api, request: bool, data: Any
) -> None:
    """Our schema of each group API (and OffsetForLeaderEpoch), byte for byte against
    kafka-python's (an independent
    reading of Kafka's message definitions): a field in the wrong place or version shows."""
    pytest.importorskip("kafka")
    from kafka.protocol.api_message import ApiMessage

    version = data.draw(st.integers(api.min_version, api.max_version))
    schema = api.request if request else api.response
    body = data.draw(struct_of(schema.fields, version))
    writer = Writer()
    encode(schema, version, body, writer)
    ours = bytes(writer.buf)
    theirs = _kafka_python(api, request)[version].decode(ours, version=version)
    assert bytes(ApiMessage.encode(theirs)) == ours
