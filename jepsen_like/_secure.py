"""``--secure`` runs: TLS on every broker port, SCRAM users, mutual TLS between brokers.

``SecureSetup.make`` writes a development PKI (``kafkaesque.local_cluster``: a CA, a certificate
per broker whose alternative names are every address a broker is reached at) and a users file
with one generated user, and draws a random cluster secret. Brokers then start with
``--client-tls --peer-tls --admin-tls``, their certificate, ``--users-file`` and the secret in
``KAFKAESQUE_CLUSTER_SECRET`` (``broker_args``, ``broker_env``); every client of the run, the
workload's and the harness's own questions (``client_security``: SASL_SSL, the client's TLS
and SCRAM), authenticates as that user. The user is a super user: the run tests the transport,
not ACLs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kafkaesque.local_cluster import DevSecurity, random_secret

USER = "jepsen"


@dataclass(frozen=True)
class SecureSetup(DevSecurity):
    """The certificates, user and secret of one secure run (see the module docstring): a
    ``DevSecurity`` with a certificate per broker, the admin port on TLS too, and a random
    cluster secret."""

    cluster_secret: str = field(default="", repr=False)

    @classmethod
    def make_run(cls, directory: str, nodes: Iterable[int], hosts: Iterable[str]) -> SecureSetup:
        """Write the PKI and users file into ``directory``; ``hosts`` are the addresses brokers
        are reached at (their own, proxies'), added to 127.0.0.1 and localhost."""
        names = list(dict.fromkeys(["127.0.0.1", "localhost", *hosts]))
        pki, users_file, password = cls.files(directory, USER, nodes, names)
        return cls(pki, users_file, USER, password, random_secret())

    def broker_args(self, node: int = 0, *, super_user: bool = True) -> list[str]:
        """The security flags of broker ``node``'s command line."""
        return [*super().broker_args(node, super_user=super_user), "--admin-tls"]

    def broker_env(self) -> dict[str, str]:
        """Environment of every broker: the cluster's secret (never on a command line)."""
        return {"KAFKAESQUE_CLUSTER_SECRET": self.cluster_secret}
