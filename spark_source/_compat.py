"""Streaming admission control across Spark versions.

Spark 4.2 added ``ReadLimit`` (``ReadAllAvailable``, ``ReadMaxRows``...) and
``SupportsTriggerAvailableNow`` to ``pyspark.sql.streaming.datasource``, and calls
``latestOffset(start, limit)``. Spark 4.1 has none of them and calls ``latestOffset()``. On 4.1
the stand-ins below let the module import; Spark never passes them, the reader only builds them
for ``getDefaultReadLimit``, which 4.1 does not call.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.1; the suite runs 4.2+

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadLimit``."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadAllAvailable``."""

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadMaxRows``."""

        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's mixin (4.1 has no ``Trigger.AvailableNow`` for Python)."""


__all__ = ["ReadAllAvailable", "ReadLimit", "ReadMaxRows", "SupportsTriggerAvailableNow"]
