"""The device simulator's parent side: ``Fleet`` runs ``FleetSpec.devices`` devices over several
worker processes (``_devices_worker``) and merges what they measured.

Workers are started with the ``spawn`` context (a clean interpreter, no inherited sockets), one
pipe each. The parent waits for every worker's ``ready``, sends ``go`` to all of them at once
(so their measured windows coincide), optionally ``stop``, and collects the ``result``s. A
``Fleet`` is a context manager that kills any worker still running when it exits.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from ._devices_worker import FleetSpec, WorkerResult, reconnect_delay, worker_main

__all__ = ["Fleet", "FleetError", "FleetSpec", "Readiness", "WorkerResult", "reconnect_delay"]


class FleetError(RuntimeError):
    """A worker failed or did not answer in time; the message says which and why."""


@dataclass(frozen=True)
class Readiness:
    """What the workers said once their devices had connected."""

    connected: int
    failed: int
    seconds: float  # the slowest worker's connecting time
    errors: list[str]


class Fleet:
    """``spec.devices`` devices over ``processes`` worker processes; a context manager that
    always ends its workers.

    Use: ``with Fleet(spec, 4) as fleet: fleet.wait_ready(); fleet.go(); result =
    fleet.result()``. ``stop()`` ends the publishing early (then ``result()``).
    """

    def __init__(self, spec: FleetSpec, processes: int = 1) -> None:
        if spec.devices < 1 or not spec.addresses:
            raise FleetError("a fleet needs at least one device and one address")
        self.spec = spec
        processes = max(1, min(processes, spec.devices))
        context = multiprocessing.get_context("spawn")
        self._pipes: list[multiprocessing.connection.Connection] = []
        self._procs: list[BaseProcess] = []
        base, extra = divmod(spec.devices, processes)
        first = spec.first_device
        for k in range(processes):
            count = base + (1 if k < extra else 0)
            ours, theirs = context.Pipe()
            proc = context.Process(
                target=worker_main,
                args=(spec, first, count, theirs),
                name=f"kafkaesque-devices-{k}",
                daemon=True,
            )
            self._pipes.append(ours)
            self._procs.append(proc)
            first += count

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def __enter__(self) -> Fleet:
        try:
            for proc in self._procs:
                proc.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # that worker is gone already
                pipe.send("stop")
        for proc in self._procs:
            if proc.pid is None:
                continue
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for pipe in self._pipes:
            pipe.close()

    def _expect(self, event: str, timeout: float) -> list[Any]:
        deadline = time.monotonic() + timeout
        answers: list[Any] = []
        for k, pipe in enumerate(self._pipes):
            left = deadline - time.monotonic()
            if not pipe.poll(max(0.0, left)):
                raise FleetError(f"worker {k}: no {event!r} within {timeout:.0f} s")
            try:
                kind, body = pipe.recv()
            except EOFError:
                raise FleetError(f"worker {k} exited before {event!r}") from None
            if kind == "error":
                raise FleetError(f"worker {k} failed:\n{body}")
            if kind != event:
                raise FleetError(f"worker {k}: {kind!r} instead of {event!r}")
            answers.append(body)
        return answers

    def wait_ready(self, timeout: float | None = None) -> Readiness:
        """Until every worker has connected its devices (or given up on them)."""
        spec = self.spec
        if timeout is None:
            timeout = spec.connect_timeout * (1 + spec.devices / (spec.max_connecting * 20)) + 60
        answers = self._expect("ready", timeout)
        return Readiness(
            connected=sum(a["connected"] for a in answers),
            failed=sum(a["failed"] for a in answers),
            seconds=max(a["seconds"] for a in answers),
            errors=[e for a in answers for e in a["errors"]][:10],
        )

    def go(self) -> None:
        """Every worker starts publishing now."""
        for pipe in self._pipes:
            pipe.send("go")

    def stop(self) -> None:
        """Stop publishing now (the workers then drain and report)."""
        for pipe in self._pipes:
            pipe.send("stop")

    def result(self, timeout: float | None = None) -> WorkerResult:
        """Every worker's result, merged; after ``go`` (or ``stop``)."""
        spec = self.spec
        if timeout is None:
            timeout = spec.duration + spec.drain + 60
        merged = WorkerResult()
        for answer in self._expect("result", timeout):
            merged.merge(answer)
        return merged
