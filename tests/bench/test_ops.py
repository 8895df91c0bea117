"""bench.ops's figures: the longest gap between acknowledgements, and the p99 over partitions."""

from __future__ import annotations

import pytest

from bench.ops import PartitionProbes, p99


def test_the_longest_gap_counts_the_phase_edges_as_acknowledgements() -> None:
    probes = PartitionProbes("127.0.0.1:1", "t", 3)  # never entered: no thread runs
    probes.acks[0] = [0.5, 10.2, 10.3, 10.9, 12.0, 20.0]  # outside [10, 12] partly
    probes.acks[1] = []  # nothing acknowledged during the phase
    probes.acks[2] = [10.0, 10.5, 11.9]
    assert probes.longest_gaps(10.0, 12.0) == pytest.approx([1.1, 2.0, 1.4])


def test_p99_is_the_nearest_rank() -> None:
    assert p99([0.1]) == 0.1
    assert p99([0.3, 0.1, 0.2]) == 0.3
    values = [i / 1000 for i in range(1, 201)]  # 0.001 .. 0.200
    assert p99(values) == 0.198
