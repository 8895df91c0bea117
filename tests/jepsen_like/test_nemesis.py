"""The shapes of the partition nemesis, on a recording network (a pure unit: no processes).

Whatever shape is drawn, a partition must leave a majority that can talk, and the one-way
shape must cut one direction only.
"""

from __future__ import annotations

import random
from itertools import combinations

import pytest
from kafkaesque.jepsen_like._nemesis import NemesisContext, Network, _start_partition


class _Cluster:
    """Just what ``_start_partition`` asks of a cluster: its members and a leader."""

    def __init__(self, n: int) -> None:
        self.members = list(range(n))
        self.paused: set[int] = set()

    def alive(self) -> list[int]:
        return self.members

    async def leaders(self, topic: str) -> dict[int, int]:
        return {0: 0, 1: 1}


def _context(n: int, seed: int, cuts: set[tuple[int, int]]) -> NemesisContext:
    network = Network(lambda a, b: cuts.add((a, b)), cuts.clear, None)
    return NemesisContext(_Cluster(n), network, "t", 2, random.Random(seed))


def _largest_connected_group(n: int, cuts: set[tuple[int, int]]) -> int:
    """The largest set of nodes that all reach each other both ways, directly."""
    for size in range(n, 0, -1):
        for group in combinations(range(n), size):
            if all((a, b) not in cuts and (b, a) not in cuts for a in group for b in group):
                return size
    return 0


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("seed", range(40))
async def test_every_partition_shape_leaves_a_connected_majority(n: int, seed: int) -> None:
    cuts: set[tuple[int, int]] = set()
    ctx = _context(n, seed, cuts)
    await _start_partition(ctx)
    assert cuts, "a partition cuts something"
    shape = ctx.log[-1]
    if "one-way" in shape:
        assert all((b, a) not in cuts for a, b in cuts), "one-way cuts one direction only"
    else:
        assert all((b, a) in cuts for a, b in cuts), "the other shapes cut both directions"
        assert _largest_connected_group(n, cuts) > n // 2, shape
