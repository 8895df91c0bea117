"""Fault injection on a real cluster, a recorded history, and a checker for it.

The public face ``kafkaesque jepsen`` runs through: ``run(RunOptions(...))`` starts the brokers
(``kafkaesque.local_cluster``'s launcher), the workload (``WorkloadOptions``) and the nemeses
(``NEMESES``, by name), then checks the history; ``JepsenError`` is a run that could not be
made. ``history`` and ``checker`` are public modules of their own (the history's format, the
checker's rules).
"""

from ._nemesis import NEMESES
from ._workload import WorkloadOptions
from .runner import JepsenError, RunOptions, RunOutcome, run

__all__ = ["NEMESES", "JepsenError", "RunOptions", "RunOutcome", "WorkloadOptions", "run"]
