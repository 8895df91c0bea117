"""``LatencyHistogram``: the same text as prometheus-client's ``Histogram``, for less work."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kafkaesque.broker._metrics import _LATENCY_BUCKETS, LatencyHistogram


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=50))
def test_it_renders_what_prometheus_clients_histogram_renders(values: list[float]) -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LatencyHistogram("k_latency_seconds", "How long.")
    ours_registry.register(ours)
    theirs = Histogram(
        "k_latency_seconds", "How long.", buckets=_LATENCY_BUCKETS, registry=theirs_registry
    )
    for value in [*values, *_LATENCY_BUCKETS]:  # the bounds themselves: le is inclusive
        ours.observe(value)
        theirs.observe(value)
    assert _without_created(generate_latest(ours_registry)) == _without_created(
        generate_latest(theirs_registry)
    )


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        LatencyHistogram("k_seconds", "How long.", buckets=(0.1, 0.01))
