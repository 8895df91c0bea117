"""Small durable state files (Raft term/vote, the term table): msgpack, CRC32C, atomic replace.

A state file is ``crc32c(payload) (4 bytes, big-endian) + payload`` where the payload is a
msgpack map. Writing goes through a temporary file, fsync, rename and an fsync of the directory,
so a reader sees either the old or the new content, never a mix, even after power loss.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack
from crc32c import crc32c

from ._errors import CorruptLogError

_CRC = struct.Struct(">I")


def fsync_directory(directory: str) -> None:
    """Make renames, creations and deletions inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)``, and every directory it created made durable:
    the parent of each new directory is fsynced (a new directory's entry is lost on power loss
    until its parent is fsynced, and with it every file inside, synced or not)."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not missing:
        return
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):  # top down: a child's entry needs its parent durable
        fsync_directory(os.path.dirname(created))


def write_state_file(directory: str, name: str, state: dict[str, Any]) -> None:
    """Atomically and durably replace ``directory/name`` with ``state``."""
    payload = msgpack.packb(state, use_bin_type=True)
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, _CRC.pack(crc32c(payload)) + payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(directory)


def read_state_file(directory: str, name: str) -> dict[str, Any] | None:
    """Read ``directory/name``; None if absent. Raises ``CorruptLogError`` if it fails its CRC."""
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _CRC.size:
        raise CorruptLogError(path, 0, "state file shorter than its checksum")
    (want,) = _CRC.unpack_from(data)
    payload = data[_CRC.size :]
    if crc32c(payload) != want:
        raise CorruptLogError(path, 0, "state file checksum mismatch")
    state = msgpack.unpackb(payload, raw=False)
    if not isinstance(state, dict):
        raise CorruptLogError(path, _CRC.size, "state file does not hold a map")
    return state
