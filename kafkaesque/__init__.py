"""Kafkaesque: a Raft-replicated, partitioned log broker.

Layers depend downward only (see docs/architecture.md): ``protocol`` and ``storage`` import
nothing of ours, ``raft`` imports ``storage``, ``broker`` wires everything, and ``cli``,
``spark_source`` and ``jepsen_like`` use the broker only through ``kafkaesque.client``.
"""

__version__ = "0.1.0"
