"""Local clusters: broker processes on this machine, and a development PKI for secure ones.

The one launcher of brokers for ``kafkaesque cluster``, the demo, the tests, the benchmarks and
the fault injector (``kafkaesque.jepsen_like``)::

    with LocalCluster(data_dir, 3) as cluster:      # started, every broker registered
        client = Client(cluster.bootstrap)
        cluster.kill(1)                             # SIGKILL: a crash
        cluster.start(1)
        cluster.wait_in_sync(1)                     # its replicas caught up

``SecureCluster`` is the same with TLS and SCRAM (``DevSecurity``: a CA, certificates, a user).
``BrokerProcesses`` is the process keeping both are made of, for a cluster placed otherwise.
"""

from ._dev_pki import (
    DEFAULT_HOSTS,
    BrokerCertificate,
    DevPki,
    DevSecurity,
    SecureCluster,
    make_dev_pki,
    random_secret,
    write_users,
)
from ._launcher import (
    BrokerPorts,
    BrokerProcesses,
    ClusterError,
    LocalCluster,
    RollingStep,
    answers_ping,
    broker_program,
    describe_exit,
    free_ports,
    one_attempt,
    parse_samples,
    replicas_behind,
)

__all__ = [
    "DEFAULT_HOSTS",
    "BrokerCertificate",
    "BrokerPorts",
    "BrokerProcesses",
    "ClusterError",
    "DevPki",
    "DevSecurity",
    "LocalCluster",
    "RollingStep",
    "SecureCluster",
    "answers_ping",
    "broker_program",
    "describe_exit",
    "free_ports",
    "make_dev_pki",
    "one_attempt",
    "parse_samples",
    "random_secret",
    "replicas_behind",
    "write_users",
]
