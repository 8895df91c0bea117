"""Where a persistent session stands in each log partition, and how a reconnect resumes there.

Pure: no I/O, no time. A session's QoS 1/2 deliveries from one log partition are described by
a ``Progress``: ``next``, the offset from which every matching record is still to be delivered,
and ``owed``, the records below it that were handed to the device (or queued for it) and not
acknowledged yet, each with the packet id it was sent under and whether the device's PUBREC
came. Everything else below ``next`` was acknowledged (PUBACK, PUBCOMP), or expired, or was
too large for the device, and is never delivered again.

A reconnect with the session (MQTT-4.4.0-1) first takes the deliveries that were in flight over
under their packet ids: a QoS 2 one past PUBREC continues with PUBREL, the others are sent again
with DUP set. Then a ``CatchUp`` per partition reads the log from the lowest owed offset and
decides, record by record, what to do: resend an in-flight one (its PUBLISH, with its id), send
an owed one that never went out, skip an acknowledged one, and send every matching record from
``next`` on, until it reaches the live reader of the partition; only then do live deliveries of
that partition reach the device (one ordered stream per partition, never a record twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Position = tuple[str, int]  # (log topic, partition)
Place = tuple[str, int, int]  # (log topic, partition, offset)


@dataclass(frozen=True, slots=True, order=True)
class Owed:
    """A record delivered (or queued) to the device and not acknowledged yet.

    ``packet_id`` 0: never sent (queued when the connection ended); else the id it went out
    under, at ``qos``, and ``released`` once the device's PUBREC came (QoS 2)."""

    offset: int
    packet_id: int = 0
    qos: int = 0
    released: bool = False


@dataclass(frozen=True, slots=True)
class Progress:
    """A session's deliveries from one partition (see the module docstring).

    Invariant: every owed offset is below ``next``."""

    next: int
    owed: tuple[Owed, ...] = ()

    def __post_init__(self) -> None:
        if any(o.offset >= self.next for o in self.owed):
            raise ValueError(f"owed offsets must be below next={self.next}: {self.owed}")

    @property
    def resume(self) -> int:
        """The lowest offset the session may still lack (what records before ``owed`` kept)."""
        return min((o.offset for o in self.owed), default=self.next)


class CatchUp:
    """The redelivery of one partition of a resumed session (see the module docstring).

    ``cursor`` is the next offset to decide about; the driver reads the log from there, asks
    ``decide`` about each record in offset order below the live reader's position, and calls
    ``advance`` past what it read, until ``caught_up``; while the live reader is not past the
    cursor, it waits."""

    __slots__ = ("_resend", "_unsent", "cursor", "next")

    def __init__(self, progress: Progress) -> None:
        self.next = progress.next
        self.cursor = progress.resume
        self._unsent = {o.offset for o in progress.owed if not o.packet_id}
        # In flight, not past PUBREC: the PUBLISH goes again, with its id.
        self._resend = {o.offset: o for o in progress.owed if o.packet_id and not o.released}

    def decide(self, offset: int) -> Owed | None:
        """What the record at ``offset`` (not below ``cursor``) calls for: None, skip it (it
        was acknowledged); an ``Owed`` with a packet id, resend it under that id; one without,
        deliver it as new, if it matches the session's subscriptions."""
        if offset < self.cursor:
            raise ValueError(f"offset {offset} is behind the cursor {self.cursor}")
        if offset >= self.next:
            return Owed(offset)
        resend = self._resend.get(offset)
        if resend is not None:
            return resend
        return Owed(offset) if offset in self._unsent else None

    def owed_offsets(self) -> list[int]:
        """The offsets at or past ``cursor`` that ``decide`` may answer with an ``Owed`` below
        ``next`` (in flight, or never sent): whatever the subscriptions match now."""
        return [o for o in (*self._unsent, *self._resend) if o >= self.cursor]

    def caught_up(self, live: int) -> bool:
        """Whether the live reader, at ``live``, takes over: it stands where the catch-up
        does, and every record from there on is to be delivered (nothing to skip)."""
        return self.cursor == live and self.cursor >= self.next

    def advance(self, offset: int) -> list[Owed]:
        """Everything below ``offset`` is decided. Returns the in-flight deliveries it passed
        without their record being read (the log no longer has them): they are given up."""
        if offset <= self.cursor:
            return []
        self.cursor = offset
        self._unsent = {o for o in self._unsent if o >= offset}
        lost = [o for o in self._resend.values() if o.offset < offset]
        for owed in lost:
            del self._resend[owed.offset]
        return lost

    def resent(self, offset: int) -> None:
        """The in-flight delivery at ``offset`` was resent (or given up): not again."""
        self._resend.pop(offset, None)

    def progress(self, owed_now: Iterable[Owed]) -> Progress:
        """The partition's progress as it stands: ``owed_now`` are the deliveries made since the
        reconnect (and the ones taken over) that are not acknowledged yet."""
        owed = {o.offset: o for o in owed_now}
        for offset in self._unsent:
            owed.setdefault(offset, Owed(offset))
        next_ = max(self.cursor, self.next)
        return Progress(next_, tuple(sorted(owed.values())))


def session_progress(
    live: Mapping[Position, int],
    catching_up: Mapping[Position, CatchUp],
    unacked: Mapping[Position, Iterable[int]],
    in_flight: Mapping[Place, tuple[int, int, bool]],
    in_order_from: Mapping[Position, int],
) -> dict[Position, Progress]:
    """A connected session's progress in every partition it has a stake in.

    ``live``: for the partitions its QoS 1/2 subscriptions read, the live reader's position
    (every record below it was handed to the device); ``catching_up``: the partitions being
    redelivered; ``unacked``: the offsets delivered or queued and not acknowledged, per
    partition; ``in_flight``: for those sent, (packet id, QoS, PUBREC received);
    ``in_order_from``: per partition, the offset from which every matching record was queued
    for the device in offset order (the stored ``next`` of a resumed one; else 0)."""
    progress: dict[Position, Progress] = {}
    for where in {*live, *catching_up, *(w for w, offsets in unacked.items() if offsets)}:
        owed = [
            Owed(offset, *in_flight.get((*where, offset), (0, 0, False)))
            for offset in unacked.get(where, ())
        ]
        catch = catching_up.get(where)
        if catch is not None:
            progress[where] = catch.progress(owed)
            continue
        position = live.get(where)
        if position is None:  # no longer subscribed: only what is still in flight is owed
            position = max(o.offset for o in owed) + 1
        progress[where] = Progress(position, tuple(sorted(owed)))
    for where, p in progress.items():
        progress[where] = _compacted(p, in_order_from.get(where, 0))
    return progress


def _compacted(progress: Progress, in_order_from: int) -> Progress:
    """``progress`` with the deliveries queued and never sent at its end (above every one that
    was sent, and from ``in_order_from`` on) folded into ``next``: every matching record from
    the first of them on is owed. A device far behind would otherwise store one entry for
    each of thousands of queued messages, every second."""
    owed = list(progress.owed)
    start = progress.next
    while owed and not owed[-1].packet_id and owed[-1].offset >= in_order_from:
        start = owed.pop().offset
    return progress if start == progress.next else Progress(start, tuple(owed))
