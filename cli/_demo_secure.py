"""``kafkaesque demo --secure``: the same pipeline with security on every listener.

The brokers speak TLS on the client and peer ports (a development CA and certificate,
``local_cluster``), have a random cluster secret, and require SCRAM-SHA-256 users: ``demo`` (a super
user: the controller, the probe, the report and the Spark job authenticate as it) and
``phones`` (the devices). The MQTT listeners speak TLS too, check the devices' user name and
password against the same users file, and apply an MQTT ACL so that each phone publishes only
its own readings and receives only its own commands (``%c`` is its client id, the device id):

    pattern write phones/%c/spectrum
    pattern read phones/%c/commands

Passwords travel to the processes that need them in their environment, never on a command line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kafkaesque.local_cluster import DevSecurity, SecureCluster, random_secret, write_users

DEMO_USER = "demo"
DEVICE_USER = "phones"
MQTT_ACL = """\
# kafkaesque demo --secure: a phone publishes its own readings and reads its own commands
pattern write phones/%c/spectrum
pattern read phones/%c/commands
"""


@dataclass(frozen=True)
class DemoSecurity:
    """The demo's certificates, users, MQTT ACL and cluster secret (see the module docstring)."""

    dev: DevSecurity
    acl_file: str
    device_password: str = field(repr=False)
    cluster_secret: str = field(repr=False)

    @classmethod
    def make(cls, directory: str) -> DemoSecurity:
        """Write the PKI, the users file (``demo`` and ``phones``) and the ACL file."""
        dev = DevSecurity.make(directory, username=DEMO_USER)
        device_password = random_secret()
        write_users(dev.users_file, {DEMO_USER: dev.password, DEVICE_USER: device_password})
        acl_file = os.path.join(directory, "mqtt-acl.txt")
        with open(acl_file, "w", encoding="utf-8") as f:
            f.write(MQTT_ACL)
        return cls(dev, acl_file, device_password, random_secret())

    def cluster(self, data_dir: str, n: int, mqtt_rules: str) -> SecureCluster:
        """The demo's cluster: MQTT over TLS with users and the ACL. Its brokers take the
        cluster secret from this process's environment: call ``export_secret`` first."""
        return SecureCluster(
            data_dir,
            n,
            security=self.dev,
            mqtt=True,
            mqtt_tls=True,
            mqtt_rules=mqtt_rules,
            extra_args=["--mqtt-acl-file", self.acl_file],
        )

    def export_secret(self) -> None:
        """Put the cluster secret where the brokers this process starts read it."""
        os.environ["KAFKAESQUE_CLUSTER_SECRET"] = self.cluster_secret

    def devices_args(self) -> list[str]:
        """``kafkaesque devices`` flags: MQTT over TLS as ``phones``, the log read back over TLS
        as ``demo`` (passwords: ``devices_env``)."""
        ca = self.dev.pki.ca
        return [
            "--tls", "--cafile", ca, "--username", DEVICE_USER,
            "--tls-ca", ca, "--user", DEMO_USER,
        ]  # fmt: skip

    def devices_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKAESQUE_MQTT_PASSWORD": self.device_password,
            "KAFKAESQUE_PASSWORD": self.dev.password,
        }

    def spark_options(self) -> dict[str, str]:
        """The Spark source's security options (Spark's Kafka names, without ``kafka.``)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": DEMO_USER,
            "sasl.password": self.dev.password,
            "ssl.truststore.location": self.dev.pki.ca,
        }
