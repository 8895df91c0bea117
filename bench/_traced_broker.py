"""A ``kafkaesque broker`` process that traces its allocations on request (``bench.conn_memory``).

    python -m bench._traced_broker SNAPSHOT_FILE broker --id 0 ...

Everything after ``SNAPSHOT_FILE`` is the ``kafkaesque`` command line. SIGUSR1 starts
``tracemalloc`` (so only what is allocated from then on is traced: the baseline is what came
before); SIGUSR2 takes a snapshot and writes it to ``SNAPSHOT_FILE`` (``Snapshot.dump``, written
atomically), with ``SNAPSHOT_FILE.overhead`` holding the bytes tracemalloc itself used then (to
take off the process's RSS growth). The handlers run in the main thread between two bytecodes;
every thread's allocations are traced. Each signal also writes the count and
``sys.getsizeof`` total of the live objects the garbage collector tracks, by type
(``SNAPSHOT_FILE.types0`` at SIGUSR1, ``.types1`` at SIGUSR2), to count the objects per
connection.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tracemalloc
from types import FrameType

from ._instrumented_broker import run_instrumented

FRAMES = 10  # deep enough to reach the broker module that allocated through trio and msgpack


def _write_types(path: str) -> None:
    """Count and total ``sys.getsizeof`` of the gc-tracked objects by type name, as JSON."""
    counts: dict[str, list[int]] = {}
    for obj in gc.get_objects():
        kind = type(obj)
        row = counts.setdefault(f"{kind.__module__}.{kind.__qualname__}", [0, 0])
        row[0] += 1
        row[1] += sys.getsizeof(obj)
    with open(path + ".part", "w") as f:
        json.dump(counts, f)
    os.replace(path + ".part", path)


def install(snapshot_file: str) -> None:
    """SIGUSR1 starts tracing; SIGUSR2 writes a snapshot of what is traced to ``snapshot_file``."""

    def start(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        _write_types(snapshot_file + ".types0")
        tracemalloc.start(FRAMES)

    def dump(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        _write_types(snapshot_file + ".types1")
        snapshot = tracemalloc.take_snapshot()
        overhead = tracemalloc.get_tracemalloc_memory()
        snapshot.dump(snapshot_file + ".part")
        with open(snapshot_file + ".overhead", "w") as f:
            f.write(str(overhead))
        os.replace(snapshot_file + ".part", snapshot_file)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)


def main() -> int:
    return run_instrumented("bench._traced_broker", "SNAPSHOT_FILE", install)


if __name__ == "__main__":
    sys.exit(main())
