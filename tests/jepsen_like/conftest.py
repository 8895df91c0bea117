"""The ``jepsen`` mark: real-cluster fault-injection runs (the short ones run in CI, the long
ones are also marked ``slow``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "jepsen: a jepsen_like run against real broker processes (tests/jepsen_like)"
    )
