"""Kafka's ``cleanup.policy`` in our topic config's terms (pure).

Kafka's policy is a list: ``delete`` (retention by age and size), ``compact`` (the latest record
of each key is kept) or both. A topic of ``compact`` alone is never cut by retention: Kafka Connect
keeps its connector configs and source offsets in such topics and reads them whole at every start,
for as long as the cluster lives. Our topic has one ``compact`` flag, and retention limits that
apply whether it compacts or not; so ``compact`` alone is our compaction with unlimited retention,
``compact,delete`` our compaction with retention limits, and ``delete`` no compaction.
"""

from __future__ import annotations

from typing import Final

COMPACT: Final = "compact"
DELETE: Final = "delete"


def parse_cleanup_policy(value: str | None) -> tuple[bool, bool]:
    """``(compact, delete)`` for a ``cleanup.policy`` value such as ``compact,delete``;
    ValueError (saying what is wrong) for anything else."""
    words = [w.strip() for w in (value or "").split(",")]
    if not words or not set(words) <= {COMPACT, DELETE} or len(set(words)) != len(words):
        raise ValueError(f"cleanup.policy={value}: compact, delete, or compact,delete")
    return COMPACT in words, DELETE in words


def describe_cleanup_policy(
    compact: bool, retention_ms: int | None, retention_bytes: int | None
) -> str:
    """What a topic does, as Kafka's ``cleanup.policy`` says it (a retention of None is
    unlimited): a compacted topic with a retention limit also deletes, ``compact,delete``."""
    if not compact:
        return DELETE
    if retention_ms is None and retention_bytes is None:
        return COMPACT
    return f"{COMPACT},{DELETE}"
