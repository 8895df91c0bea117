"""What became of a proposal when the driver cannot report a commit: unknown, or failed."""

from __future__ import annotations


class CommitTimeout(Exception):
    """The proposal was appended but not known committed in time, or was cut from this log
    before it committed (another replica that holds it may still commit it): its outcome is
    unknown."""


class ProposalLost(Exception):
    """Another entry committed at the proposal's offset: it definitely failed."""
