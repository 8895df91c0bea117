"""Running a ``kafkaesque broker`` in a process that a benchmark instruments on signals.

``python -m bench.<wrapper> FILE broker ARGS...``: the wrapper installs its signal handlers with
``FILE`` (where it writes what it measured), then runs the ``kafkaesque`` command line that
follows in this process. ``bench._profiled_broker`` (cProfile), ``bench._traced_broker``
(tracemalloc) and ``bench._stage_traced_broker`` (a write's stages) are such wrappers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_instrumented(prog: str, file_name: str, install: Callable[[str], None]) -> int:
    """Install with ``sys.argv[1]`` and run the broker of ``sys.argv[2:]``; the exit status."""
    if len(sys.argv) < 3:
        print(f"usage: python -m {prog} {file_name} broker ARGS...", file=sys.stderr)
        return 2
    install(sys.argv[1])
    from kafkaesque.cli.main import main as kafkaesque_main

    return int(kafkaesque_main(sys.argv[2:]))
