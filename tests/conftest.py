"""Suite-wide settings.

Hypothesis runs derandomized under CI (``CI=true``): a submission's CI run is reproducible, and a
failure there fails again the same way on a developer's machine. Locally, examples are random, so
every run explores new cases; a failure prints its reproduction blob either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from kafkaesque.local_cluster import LocalCluster

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


@pytest.fixture(scope="module")
def broker_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three real broker processes on loopback, shared by the tests of one module.

    ``.bootstrap`` is ``host:port,...`` of their client listeners. Tests that kill or pause a
    broker start a cluster of their own (``LocalCluster``) instead.
    """
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), 3) as cluster:
        yield cluster
