"""What became of a proposal when the driver cannot report a commit: unknown, or failed."""

from __future__ import annotations


class CommitTimeout(Exception):
    """The proposal was appended but not known committed in time: its outcome is unknown."""


class ProposalLost(Exception):
    """The proposal was removed from the log before it committed: it definitely failed."""
