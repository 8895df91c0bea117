"""What a stopped broker's disk says about its Raft terms and votes, read by the harness.

Two files hold them (the broker writes each durably before sending anything that depends on it):
``<broker dir>/__raft/raft-hard-states``, a state file of every partition group's ``[term, vote,
commit]``, and ``<broker dir>/__controller/controller.journal.meta``, pysyncobj's pickled
``currentTerm`` and ``votedForNodeId`` of the controller quorum (group ``"controller"``). Read
only while the broker is down (a file being replaced would be read half-way otherwise).
"""

from __future__ import annotations

import os

from pysyncobj.pickle import loads

from kafkaesque.storage import read_state_file

from .history import RaftState

__all__ = ["CONTROLLER_GROUP", "read_raft_states"]

CONTROLLER_GROUP = "controller"
_HARD_STATES = ("__raft", "raft-hard-states")
_CONTROLLER_META = ("__controller", "controller.journal.meta")


def read_raft_states(broker_dir: str) -> tuple[tuple[RaftState, ...], list[str]]:
    """The terms and votes on ``broker_dir``'s disk, sorted by group, and the problems met (a
    file that does not parse: its groups are then absent, which the checker reports as gone)."""
    problems: list[str] = []
    states: list[RaftState] = []
    try:
        hard = read_state_file(os.path.join(broker_dir, _HARD_STATES[0]), _HARD_STATES[1])
    except (OSError, ValueError) as exc:  # CorruptLogError is a ValueError
        problems.append(f"{_HARD_STATES[1]}: {exc}")
        hard = None
    for group, value in sorted((hard or {}).get("groups", {}).items()):
        term, vote = int(value[0]), value[1]
        states.append(RaftState(str(group), term, None if vote is None else str(vote)))
    path = os.path.join(broker_dir, *_CONTROLLER_META)
    try:
        with open(path, "rb") as f:
            meta = loads(f.read())
    except FileNotFoundError:
        meta = None
    except Exception as exc:  # noqa: BLE001 - a torn pickle raises anything; it is a finding
        problems.append(f"{path}: {exc!r}")
        meta = None
    if isinstance(meta, dict) and "currentTerm" in meta:
        vote = meta.get("votedForNodeId")
        states.append(
            RaftState(
                CONTROLLER_GROUP, int(meta["currentTerm"]), None if vote is None else str(vote)
            )
        )
    return tuple(states), problems
