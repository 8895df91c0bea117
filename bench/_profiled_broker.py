"""A ``kafkaesque broker`` process that cProfiles its event-loop thread on request.

    python -m bench._profiled_broker STATS_FILE broker --id 0 ...

Everything after ``STATS_FILE`` is the ``kafkaesque`` command line. SIGUSR1 starts a cProfile
profiler in the main thread (the trio event loop: every Python call and builtin it makes);
SIGUSR2 stops it and writes the stats to ``STATS_FILE`` (atomically, so a reader never sees a
half-written file). Worker threads (fsync, pysyncobj) are not profiled: the count is of the calls
the event loop makes, which is where a write's Python work happens.

The handlers run between two bytecodes of the main thread, which is where ``enable`` must be
called for the profiler to see that thread.
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
from types import FrameType

from ._instrumented_broker import run_instrumented


def install(stats_file: str) -> None:
    """SIGUSR1 starts profiling the main thread; SIGUSR2 stops and writes ``stats_file``.

    Each SIGUSR1 starts a new profiler: a ``cProfile.Profile`` keeps adding to its stats across
    ``enable``/``disable``, so reusing one would count the earlier windows again."""
    profiler = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        nonlocal profiler
        profiler = cProfile.Profile()
        profiler.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(stats_file + ".part")
        os.replace(stats_file + ".part", stats_file)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


def main() -> int:
    return run_instrumented("bench._profiled_broker", "STATS_FILE", install)


if __name__ == "__main__":
    sys.exit(main())
