"""A group consumer as its own process, recording what it processes (for the group tests).

    python -m tests.broker.group_consumer --brokers 127.0.0.1:9092,... --topic t --group g \\
        --history out.jsonl --seconds 15

It joins with SUBS, reads with CONS (the ``+END`` pairs of the last answer), "processes" each
record by writing a history line ``{"sent": s, "t": time, "member": id, "partition": p,
"offset": o, "value": v}`` (``sent``: when its CONS went out), then commits the next offsets
with ``member=`` (at-least-once). It follows the protocol's recovery rules: on NOT_ASSIGNED it
asks GROUPS what it owns and reads on from there; on UNKNOWN_SUBSCRIPTION it joins again; on a
dead connection it moves to the next broker.
"""

from __future__ import annotations

import argparse
import json
import time

from kafkaesque.protocol import EndReply, ErrorCode, ErrorReply, GroupRow, MessageRow, OkReply

from .line_client import LineClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    addresses = [(h, int(p)) for h, _, p in (a.rpartition(":") for a in args.brokers.split(","))]
    stop = time.monotonic() + args.seconds
    via = 0
    client: LineClient | None = None
    member = ""
    position = "0"
    with open(args.history, "a", buffering=1) as history:
        while time.monotonic() < stop:
            try:
                if client is None:
                    client = LineClient(addresses[via % len(addresses)], timeout=15)
                if not member:
                    member = _ok(client.call(f"SUBS {args.topic} {args.group}"))
                    position = _owned_position(client, args.group, args.topic, member)
                sent = time.time()
                reply = client.call(f"CONS {args.topic} {member} {position} wait_ms=200")
                if not isinstance(reply, list):
                    _ok(reply)
                    continue
                rows = reply
            except (OSError, ConnectionError):
                if client is not None:
                    client.close()
                client, via = None, via + 1
                time.sleep(0.1)
                continue
            except _Refused as refused:
                if refused.code is ErrorCode.UNKNOWN_SUBSCRIPTION:
                    member = ""
                elif refused.code is ErrorCode.NOT_ASSIGNED and client is not None:
                    position = _owned_position(client, args.group, args.topic, member)
                else:
                    time.sleep(0.1)
                continue
            messages = [r for r in rows if isinstance(r, MessageRow)]
            for m in messages:
                line = {"sent": sent, "t": time.time(), "member": member, "partition": m.partition}
                line |= {"offset": m.offset, "value": (m.value or b"").decode()}
                history.write(json.dumps(line) + "\n")
            end = rows[-1]
            assert isinstance(end, EndReply)
            position = ",".join(f"{p}:{o}" for p, o in end.next_offsets) or "0"
            done = {m.partition for m in messages}
            for p, o in end.next_offsets:
                if p in done:
                    reply = client.call(f"COMMIT {args.group} {args.topic} {p} {o} member={member}")
                    if isinstance(reply, ErrorReply):
                        break  # fenced: the next CONS says what to do
    if client is not None:
        client.close()


class _Refused(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


def _ok(reply: object) -> str:
    if isinstance(reply, OkReply):
        return reply.text
    if isinstance(reply, ErrorReply):
        raise _Refused(reply.code)
    raise _Refused(ErrorCode.INTERNAL)


def _owned_position(client: LineClient, group: str, topic: str, member: str) -> str:
    """CONS offsets for the partitions ``member`` owns now: their committed offsets."""
    reply = client.call(f"GROUPS {group} {topic}")
    if not isinstance(reply, list):
        _ok(reply)
        return "0"
    owned = [r for r in reply if isinstance(r, GroupRow) and r.owner == member]
    pairs = ",".join(f"{r.partition}:{r.committed or 0}" for r in owned)
    return pairs or "0"


if __name__ == "__main__":
    main()
