"""The log cleaner: retention and compaction of a partition log's sealed segments.

Kafka's ``LogCleaner`` beside its ``UnifiedLog``: the cleaner works on the segments the log
hands it and never on the log's own bookkeeping. Retention here only chooses which of the
oldest segments go (``expired_segments``); the log deletes them and moves its start, since
that changes its segment list and term table. Compaction (``compact``) rewrites sealed
segments in place, each swapped in whole through a ``.cleaned`` file, and keeps every offset,
so the log's bookkeeping does not change.

Not thread-safe: the log's owner calls these.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._batch import BatchHeader, BatchType, build_batch, data_records, decode_records, iter_batches
from ._segment import Segment, segment_name
from ._statefile import fsync_directory
from ._types import LogConfig


@dataclass(frozen=True, slots=True)
class CompactionResult:
    segments_rewritten: int
    records_removed: int
    bytes_before: int
    bytes_after: int


def expired_segments(
    segments: Sequence[Segment], config: LogConfig, now: float, *, max_offset: int | None
) -> list[Segment]:
    """The oldest sealed segments of ``segments`` (the whole log, oldest first, the active one
    last) beyond the size or age limits of ``config``, oldest first.

    Only segments wholly below ``max_offset`` qualify, and the active segment never does. A
    segment goes by size if the log without it still holds ``retention_bytes``, by age if its
    newest record (``Segment.retention_timestamp``) is older than ``retention_ms`` at ``now``;
    the first that does not go stops the choice, so what remains is a suffix of the log.
    """
    limit_bytes, limit_ms = config.retention_bytes, config.retention_ms
    total = sum(s.size for s in segments)
    doomed: list[Segment] = []
    for seg in segments[:-1]:
        if max_offset is not None and seg.next_offset > max_offset:
            break
        by_size = limit_bytes is not None and total - seg.size >= limit_bytes
        by_time = limit_ms is not None and now - seg.retention_timestamp() > limit_ms
        if not (by_size or by_time):
            break
        doomed.append(seg)
        total -= seg.size
    return doomed


def compact(
    directory: str,
    segments: Sequence[Segment],
    *,
    max_offset: int | None,
    verify: bool,
    rewritten: Callable[[Segment], None],
) -> CompactionResult:
    """Keep only the latest record of each key in the sealed segments of ``segments`` (the
    whole log in ``directory``, oldest first, the active one last).

    The latest record is looked for in the whole log below ``max_offset`` (the active
    segment included, which is itself never rewritten); only sealed segments wholly below
    ``max_offset`` are rewritten. Records without a key, and control batches, are kept.
    Tombstones (a key with a None value) are kept as the key's latest record. A batch keeps
    its offsets and span even when records go (an emptied batch stays as a header), so
    offsets, terms and Raft's view of the log do not change. ``verify``: check the CRCs of
    what is read. ``rewritten`` is told of each segment as soon as its new file is in place.
    """
    candidates = [s for s in segments[:-1] if max_offset is None or s.next_offset <= max_offset]
    if not candidates:
        return CompactionResult(0, 0, 0, 0)
    latest: dict[bytes, int] = {}
    for seg in segments:
        # The segment was read (and checked, with ``verify``) whole: no second check here.
        for record in data_records(_segment_bytes(seg, verify), verify=False):
            if record.key is not None and (max_offset is None or record.offset < max_offset):
                latest[record.key] = record.offset
    rewritten_count = removed = before = after = 0
    for seg in candidates:
        parts: list[bytes] = []
        changed = 0
        for _, header, batch in _segment_batches(seg, verify):
            if header.batch_type is not BatchType.DATA:
                parts.append(bytes(batch))
                continue
            records = decode_records(batch, header)
            kept = [r for r in records if r.key is None or latest.get(r.key) == r.offset]
            if len(kept) == len(records):
                parts.append(bytes(batch))
                continue
            changed += len(records) - len(kept)
            parts.append(
                build_batch(
                    kept,
                    base_offset=header.base_offset,
                    term=header.term,
                    batch_type=header.batch_type,
                    producer_id=header.producer_id,
                    producer_epoch=header.producer_epoch,
                    base_sequence=header.base_sequence,
                    offset_deltas=[r.offset - header.base_offset for r in kept],
                    last_offset_delta=header.last_offset_delta,
                    max_timestamp=header.max_timestamp,
                )
            )
        if not changed:
            continue
        before += seg.size
        cleaned = os.path.join(directory, segment_name(seg.base_offset) + ".log.cleaned")
        fd = os.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = b"".join(parts)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        seg.replace_contents(cleaned)
        fsync_directory(directory)
        rewritten(seg)
        after += seg.size
        rewritten_count += 1
        removed += changed
    return CompactionResult(rewritten_count, removed, before, after)


def _segment_bytes(seg: Segment, verify: bool) -> memoryview:
    """The whole segment's batches (a view: the batches are sliced, never copied)."""
    if seg.size == 0:
        return memoryview(b"")
    data, _ = seg.read(0, seg.size, None, verify=verify)
    return memoryview(data)


def _segment_batches(seg: Segment, verify: bool) -> list[tuple[int, BatchHeader, memoryview]]:
    """``(position, header, batch)`` of every batch of the segment, in file order."""
    view = _segment_bytes(seg, verify)
    out = []
    pos = 0
    for header in iter_batches(view, verify=False):
        out.append((pos, header, view[pos : pos + header.size]))
        pos += header.size
    return out
