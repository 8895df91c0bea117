"""One Raft node as its own process, driven over a JSON-lines control port (tests, benchmarks).

    python -m bench._raft_node --id 0 --peers 0=127.0.0.1:7000,1=...,2=... --control 7100 \\
        --data DIR --groups 12

It hosts ``--groups`` groups named ``g0``, ``g1``… on a ``MultiRaft`` with a ``PeerTransport``,
and answers one JSON object per line on ``127.0.0.1:--control``:

* ``{"op": "status"}`` → ``{"role": {group: role}, "leader": {group: id}, "commit": {group: n},
  "ticks": n, "fsyncs": n}``
* ``{"op": "propose", "group": g, "value": text}`` → ``{"ok": true, "offset": n}`` once committed,
  or ``{"ok": false, "error": kind, "leader": id}``
* ``{"op": "load", "seconds": s, "records": n, "size": b, "window": w[, "only": g]}`` → for
  every group this node leads (or only ``g``), keep ``w`` batches of ``n`` records of ``b``
  random bytes in flight for ``s`` seconds;
  ``{"batches": committed, "bytes": record bytes committed, "groups": led}``
* ``{"op": "read", "group": g}`` → ``{"values": [...]}`` (committed data records, as text)
* ``{"op": "profile", "seconds": s[, "sort": key, "limit": n]}`` → ``{"stats": text}`` (cProfile
  of this process: the top ``n`` functions, 18 by default, by ``pstats`` key, own time by default)

Not a product: the broker (``kafkaesque broker``) is the real home of ``MultiRaft``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
from typing import Any

import trio

from kafkaesque.raft import NotLeader, ProposalDropped, RaftConfig, Role
from kafkaesque.raft.driver import (
    CommitTimeout,
    MultiRaft,
    PeerTransport,
    ProposalLost,
    RaftReplica,
)
from kafkaesque.storage import Record, build_batch


def _count_committed(group: RaftReplica, pending: collections.deque[tuple[int, int]]) -> int:
    """Pop the proposals ``(last offset, term)`` the commit index passed; count those committed
    in their term (the others were overwritten). Terms never decrease along a log, so a run of
    proposals of one term whose first and last offsets hold that term all do."""
    committed = 0
    while pending and pending[0][0] <= group.commit_index:
        term = pending[0][1]
        run = []
        while pending and pending[0][0] <= group.commit_index and pending[0][1] == term:
            run.append(pending.popleft()[0])
        if group.log.term_at(run[0]) == term == group.log.term_at(run[-1]):
            committed += len(run)
        else:
            committed += sum(group.log.term_at(last) == term for last in run)
    return committed


def _parse_peers(text: str) -> dict[int, tuple[str, int]]:
    peers = {}
    for part in text.split(","):
        node, _, addr = part.partition("=")
        host, _, port = addr.rpartition(":")
        peers[int(node)] = (host, int(port))
    return peers


class Node:
    def __init__(self, args: argparse.Namespace) -> None:
        self.peers = _parse_peers(args.peers)
        self.id = args.id
        self.raft = MultiRaft(
            self.id,
            self._post,
            flush=self._flush,
            state_dir=args.data,
            peers=self.peers,
            raft_config=lambda i: RaftConfig(
                id=i, max_inflight=args.max_inflight, max_msg_bytes=args.max_msg_bytes
            ),
        )
        self.transport = PeerTransport(
            self.id,
            self.peers,
            cluster="bench",
            secret=args.secret.encode(),
            on_items=self.raft.handle_items,
            on_peer_change=self.raft.peer_changed,
        )
        for i in range(args.groups):
            self.raft.add_replica(f"g{i}", os.path.join(args.data, f"g{i}"), self.peers)
        self.control_port = args.control

    # The transport is made after the driver (which it calls back): these reach it late.
    def _post(self, peer: int, item: Any) -> bool:
        return self.transport.post(peer, item)

    def _flush(self) -> None:
        self.transport.flush()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.run, "127.0.0.1", self.peers[self.id][1])
            await nursery.start(self.raft.run)
            await trio.serve_tcp(self._control, self.control_port, host="127.0.0.1")

    async def _control(self, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    reply = await self._handle(json.loads(line))
                    await stream.send_all(json.dumps(reply).encode() + b"\n")
        except trio.BrokenResourceError:
            return

    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "status":
            groups = self.raft.replicas
            return {
                "role": {g: grp.role.value for g, grp in groups.items()},
                "leader": {g: grp.leader for g, grp in groups.items()},
                "commit": {g: grp.commit_index for g, grp in groups.items()},
                "term": {g: grp.node.term for g, grp in groups.items()},
                "quiesced": sum(grp.quiesced for grp in groups.values()),
                "ticks": self.raft.ticks,
                "fsyncs": self.raft.fsyncs,
            }
        if op == "propose":
            batch = build_batch([Record(value=str(req["value"]).encode())])
            try:
                _, last = await self.raft.propose(req["group"], batch, 1, timeout=3)
            except NotLeader as exc:
                return {"ok": False, "error": "not_leader", "leader": exc.leader}
            except (ProposalDropped, ProposalLost) as exc:
                return {"ok": False, "error": type(exc).__name__}
            except CommitTimeout:
                return {"ok": False, "error": "timeout"}
            return {"ok": True, "offset": last}
        if op == "load":
            return await self._load(req)
        if op == "read":
            return {"values": self._read(req["group"])}
        if op == "profile":
            sort, limit = str(req.get("sort", "tottime")), int(req.get("limit", 18))
            return {"stats": await self._profile(float(req["seconds"]), sort, limit)}
        return {"error": f"unknown op {op}"}

    async def _load(self, req: dict[str, Any]) -> dict[str, Any]:
        records, size, window = int(req["records"]), int(req["size"]), int(req["window"])
        batch = build_batch([Record(value=os.urandom(size)) for _ in range(records)])
        led = [g for g, grp in self.raft.replicas.items() if grp.role is Role.LEADER]
        if "only" in req:
            led = [g for g in led if g == req["only"]]
        done = {"batches": 0}
        deadline = trio.current_time() + float(req["seconds"])

        async def pipeline(log_id: str) -> None:
            # Keep ``window`` batches in flight; count a batch once the commit index passes it
            # in the term it was proposed in (the broker's ingress path).
            group = self.raft.replicas[log_id]
            pending: collections.deque[tuple[int, int]] = collections.deque()
            while trio.current_time() < deadline:
                try:
                    while len(pending) < window:
                        pending.append(self.raft.propose_nowait(log_id, batch, records))
                except (NotLeader, ProposalDropped):
                    pending.clear()
                    await trio.sleep(0.01)
                    continue
                with trio.move_on_at(deadline):
                    await group.changed.wait()
                done["batches"] += _count_committed(group, pending)

        async with trio.open_nursery() as nursery:
            for group in led:
                nursery.start_soon(pipeline, group)
        return {
            "batches": done["batches"],
            "bytes": done["batches"] * records * size,
            "groups": len(led),
        }

    async def _profile(self, seconds: float, sort: str = "tottime", limit: int = 18) -> str:
        """cProfile this process for ``seconds``; the top ``limit`` functions by ``sort`` (a
        ``pstats`` key: own time by default), as text."""
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        await trio.sleep(seconds)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(limit)
        return out.getvalue()

    def _read(self, log_id: str) -> list[str]:
        records = self.raft.replicas[log_id].committed_records()
        return [(r.value or b"").decode() for r in records]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._raft_node")
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--peers", required=True, help="id=host:port,...")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--secret", default="bench-secret")
    parser.add_argument("--max-inflight", type=int, default=RaftConfig(id=0).max_inflight)
    parser.add_argument("--max-msg-bytes", type=int, default=RaftConfig(id=0).max_msg_bytes)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    trio.run(Node(args).run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
