"""The shapes of the power-loss nemesis, on a recording cluster and recording disks (a pure
unit: no processes, no mounts).

The first power loss of a run is the whole cluster's; the NATS choreographies starve a
minority, power-fail one member of the majority and start it again, then leave exactly a
majority made of the crashed node and the starved ones; stop heals everything.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from kafkaesque.jepsen_like import _nemesis
from kafkaesque.jepsen_like._nemesis import (
    NemesisContext,
    Network,
    NothingToDo,
    _start_pause,
    _start_power_loss,
    _stop_power_loss,
)


class _Cluster:
    """The process control the nemesis uses, recorded."""

    def __init__(self, n: int) -> None:
        self.members = list(range(n))
        self.up = set(self.members)
        self.paused: set[int] = set()
        self.events: list[tuple[str, int]] = []

    def alive(self) -> list[int]:
        return sorted(self.up)

    def running(self, node: int) -> bool:
        return node in self.up

    def kill(self, node: int) -> None:
        self.up.discard(node)
        self.paused.discard(node)
        self.events.append(("kill", node))

    def start(self, node: int) -> None:
        self.up.add(node)
        self.events.append(("start", node))

    def pause(self, node: int) -> None:
        self.paused.add(node)

    def resume(self, node: int) -> None:
        self.paused.discard(node)

    async def ask_any(self, question: Any, timeout: float = 3.0) -> None:
        return None  # the probe's CREATE: acknowledged

    async def leaders(self, topic: str) -> dict[int, int]:
        return {}


class _Disk:
    def __init__(self, mount_point: str, cuts: list[int], node: int) -> None:
        self.mount_point, self.cuts, self.node = mount_point, cuts, node
        self.generation = 0
        self.log: list[str] = []

    def power_cut(self) -> int:
        self.cuts.append(self.node)
        self.generation += 1
        return 1


class _Disks:
    def __init__(self, n: int, root: Path) -> None:
        self.cuts: list[int] = []
        self.disks = {i: _Disk(str(root), self.cuts, i) for i in range(n)}


def _context(n: int, seed: int, tmp_path: Path, cuts: set[tuple[int, int]]) -> NemesisContext:
    network = Network(lambda a, b: cuts.add((a, b)), cuts.clear, None)
    ctx = NemesisContext(_Cluster(n), network, "t", 2, random.Random(seed))
    ctx.disks = _Disks(n, tmp_path)
    return ctx


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("seed", range(6))
async def test_power_loss_shapes(
    n: int, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_nemesis, "STARVE_S", (0.0, 0.0))
    cuts: set[tuple[int, int]] = set()
    ctx = _context(n, seed, tmp_path, cuts)
    cluster: _Cluster = ctx.cluster
    disks: _Disks = ctx.disks
    shapes = []
    for _ in range(10):
        disks.cuts.clear()
        before = dict(ctx.power_losses)
        targets = await _start_power_loss(ctx)
        (shape,) = [
            s for s in ("one", "all", "pause-kill", "part-kill")
            if ctx.power_losses[s] > before.get(s, 0)
        ]  # fmt: skip
        shapes.append(shape)
        if shape == "all":
            assert sorted(disks.cuts) == list(range(n)) and not cluster.up
        elif shape in ("pause-kill", "part-kill"):
            (crashed,) = disks.cuts
            assert cluster.running(crashed), "the crashed node is started again"
            if shape == "pause-kill":
                talking = [m for m in cluster.alive() if m not in cluster.paused]
            else:
                talking = [m for m in range(n) if (m, crashed) not in cuts]
            assert crashed in talking and len(talking) == n // 2 + 1, "a bare majority"
        else:
            assert len(disks.cuts) == 1 and targets == (f"n{disks.cuts[0]}",)
        await _stop_power_loss(ctx)
        assert cluster.up == set(range(n)) and not cluster.paused and not cuts
    assert shapes[0] == "all" and shapes[5] == "all", shapes
    assert {"pause-kill", "part-kill", "one"} <= set(shapes), shapes
    assert ctx.power_losses["all"] == 2 and ctx.power_losses["nodes"] == sum(
        n if s == "all" else 1 for s in shapes
    )


async def test_with_every_broker_down_a_fault_finds_nothing_to_do(tmp_path: Path) -> None:
    # Seen in a long run: all three brokers stopped (SIGTERM from outside the harness); the
    # next pause must complete `fail`, not end the run with an IndexError.
    ctx = _context(3, 0, tmp_path, set())
    cluster: _Cluster = ctx.cluster
    cluster.up.clear()
    with pytest.raises(NothingToDo):
        await _start_pause(ctx)
    with pytest.raises(NothingToDo):
        ctx.power_loss_bag = ["one"]
        await _start_power_loss(ctx)
