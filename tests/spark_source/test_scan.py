"""The compiled record scanner reads every msgpack integer width, signed and unsigned."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from kafkaesque.spark_source import _scan

# (value, encoding): each msgpack integer format, at the edges of its range.
ENCODINGS = [
    (0, b"\x00"),
    (127, b"\x7f"),
    (-1, b"\xff"),
    (-32, b"\xe0"),
    (255, b"\xcc\xff"),
    (65535, b"\xcd\xff\xff"),
    (2**32 - 1, b"\xce\xff\xff\xff\xff"),
    (2**63 - 1, b"\xcf" + struct.pack(">Q", 2**63 - 1)),
    (-128, b"\xd0\x80"),
    (-32768, b"\xd1\x80\x00"),
    (-(2**31), b"\xd2" + struct.pack(">i", -(2**31))),
    (-(2**63), b"\xd3" + struct.pack(">q", -(2**63))),
    (5, b"\xd3" + struct.pack(">q", 5)),  # a small value in a wide format is still valid
]


def read_int(encoded: bytes) -> tuple[int, int, int]:
    buf = np.frombuffer(encoded, np.uint8)
    value, end, error = _scan._int(buf, 0, len(encoded))
    return int(value), int(end), int(error)


@pytest.mark.parametrize(("value", "encoded"), ENCODINGS)
def test_every_integer_format_reads_as_its_value(value: int, encoded: bytes) -> None:
    assert read_int(encoded) == (value, len(encoded), _scan.OK)


def test_an_unsigned_64_bit_integer_above_the_signed_range_is_refused() -> None:
    assert read_int(b"\xcf" + struct.pack(">Q", 2**63))[2] == _scan.TOO_BIG


@pytest.mark.parametrize("encoded", [b"\xcd\xff", b"\xd3\x00\x00", b""])
def test_an_integer_cut_short_runs_past_the_end(encoded: bytes) -> None:
    assert read_int(encoded)[2] == _scan.TRUNCATED


@pytest.mark.parametrize("encoded", [b"\xc0", b"\xc4\x00", b"\xa1a", b"\xca\x00\x00\x00\x00"])
def test_anything_but_an_integer_is_refused(encoded: bytes) -> None:
    assert read_int(encoded)[2] == _scan.NOT_AN_INT
