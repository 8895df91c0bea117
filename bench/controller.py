"""Controller benchmark: what the durable journal costs the metadata quorum (issue 36).

    python -m bench.controller [--quick]

Three controllers (``ClusterMetadata``: pysyncobj over loopback, each on its own thread, their
journals in a temporary directory on the machine's disk) in one process. Measured twice in the
same run, each time on a fresh quorum: with the durable journal (the default: every entry, term
and vote fsynced before pysyncobj acknowledges or votes) and with pysyncobj's own journal, which
never fsyncs (``ControllerSettings(durable_journal=False)``, the behaviour before issue 36).

* CREATE latency: topics created one after the other through a follower's controller (as a
  broker that is not the controller leader does); p50 and p99 in ms.
* operations per second: ``WINDOW`` creates in flight at once through every controller, for a
  fixed count; completed creates divided by the elapsed time.

RESULT fields: ``controller_ops_per_s``, ``create_p50_ms``, ``create_p99_ms`` (durable) and the
same with ``_before`` (pysyncobj's journal), plus ``ops_ratio`` (durable / before).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from kafkaesque.broker import BrokerInfo, ClusterMetadata, ControllerSettings, TopicConfig
from kafkaesque.local_cluster import free_ports

SECRET = b"bench-controller"
WINDOW = 16
_TOPIC = TopicConfig(partitions=3, replication_factor=3)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(durable: bool, creates: int, concurrent: int) -> tuple[float, float, float]:
    """(ops per second, create p50 ms, create p99 ms) on a fresh quorum of three."""
    settings = ControllerSettings(durable_journal=durable)
    ports = free_ports(3)
    controllers = {i: ("127.0.0.1", port) for i, port in enumerate(ports)}
    # On the home directory's disk: /tmp may be a tmpfs, where an fsync costs nothing.
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        members = [
            ClusterMetadata(i, controllers, str(Path(tmp) / str(i)), SECRET, settings=settings)
            for i in controllers
        ]
        async with trio.open_nursery() as nursery:
            for md in members:
                await nursery.start(md.run)
            with trio.fail_after(60):
                for md in members:
                    await md.wait_ready()
                for i, (host, port) in controllers.items():
                    await members[0].register_broker(BrokerInfo(i, host, 9000 + i, 0, port))
            leader = members[0].view.controller_leader
            follower = next(md for i, md in enumerate(members) if i != leader)
            latencies = []
            for n in range(creates):
                start = time.perf_counter()
                await follower.create_topic(f"seq-{n}", _TOPIC)
                latencies.append((time.perf_counter() - start) * 1000)
            done = 0

            async def worker(md: ClusterMetadata, w: int) -> None:
                nonlocal done
                for n in range(w, concurrent, WINDOW):
                    await md.create_topic(f"par-{n}", _TOPIC)
                    done += 1

            start = time.perf_counter()
            async with trio.open_nursery() as workers:
                for w in range(WINDOW):
                    workers.start_soon(worker, members[w % len(members)], w)
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
    return done / elapsed, statistics.median(latencies), _p(latencies, 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer creates (under a minute)")
    args = parser.parse_args()
    creates, concurrent = (100, 300) if args.quick else (400, 1500)
    figures: dict[str, str] = {}
    for durable, suffix in ((False, "_before"), (True, "")):
        ops, p50, p99 = trio.run(_measure, durable, creates, concurrent)
        print(f"{'durable' if durable else 'pysyncobj'} journal: {ops:.0f} ops/s, "
              f"CREATE p50 {p50:.2f} ms, p99 {p99:.2f} ms")  # fmt: skip
        figures |= {
            f"controller_ops_per_s{suffix}": f"{ops:.1f}",
            f"create_p50_ms{suffix}": f"{p50:.2f}",
            f"create_p99_ms{suffix}": f"{p99:.2f}",
        }
    ratio = float(figures["controller_ops_per_s"]) / float(figures["controller_ops_per_s_before"])
    figures["ops_ratio"] = f"{ratio:.2f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
