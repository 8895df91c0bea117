"""Fault injection on a real cluster, a recorded history, and a checker for it.

Public modules: ``runner`` (``run(RunOptions(...))``: the brokers, from
``kafkaesque.local_cluster``'s launcher, the workload, ``WorkloadOptions``, and the nemeses,
``NEMESES`` by name; then the check: what ``kafkaesque jepsen`` runs), ``history`` (the
history's format) and ``checker`` (its rules; ``python -m kafkaesque.jepsen_like.checker``).
This file imports none of them, so that running one with ``-m`` does not import it twice.
"""
