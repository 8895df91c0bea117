"""Make a documented command run against the test's cluster instead of the documented one.

The docs show the default ports of ``kafkaesque cluster up`` (broker *i* listens on
``9092 + 10*i + k``: clients k=0, Raft peers 1, controllers 2, admin/metrics 3, MQTT 4, Kafka 5, see
``BrokerPorts`` of local_cluster) and default data directories. The test runs its cluster on a
free block of ports and in a temporary directory, so every command is rewritten the same way:

* a documented port ``9092 + 10*i + k`` becomes ``base + 10*i + k``;
* ``cluster up`` without ``--base-port`` gets the test's block; any ``--data-dir`` (given or not)
  points into the scratch directory;
* the "existing MQTT broker" of docs/mqtt-bridge.md, documented on mosquitto's port 1883, is
  a mosquitto the test started (``upstream_mqtt``);
* client commands without ``--bootstrap`` need no rewrite, their default comes from
  ``$KAFKAESQUE_BOOTSTRAP``, which the runner sets; ``kafkaesque devices`` without ``--mqtt``
  asks that cluster where its MQTT listeners are.

Nothing else is changed: a command that needs more than this to run is a doc to fix.
"""

from __future__ import annotations

import random
import re
import socket
from dataclasses import dataclass
from pathlib import Path

DOC_BASE_PORT = 9092
PORTS_PER_BROKER = 10  # kafkaesque/local_cluster/_launcher.py _PORTS_PER_BROKER
PORT_KINDS = 7  # client, peer, controller, admin, mqtt, kafka, http
DOC_BROKERS = 3
DOC_UPSTREAM_MQTT = 1883  # mosquitto's default port

_PORT = re.compile(r"(?<=[:\s=])(\d{4,5})\b")
_DATA_DIR = re.compile(r"--data-dir[ =](\S+)")


def doc_port(broker: int, kind: int) -> int:
    return DOC_BASE_PORT + PORTS_PER_BROKER * broker + kind


@dataclass(frozen=True)
class Rewriter:
    """``base_port``: the test cluster's block; ``scratch``: where data directories go;
    ``upstream_mqtt``: the port of a mosquitto standing in for the documented one, if any."""

    base_port: int
    scratch: Path
    upstream_mqtt: int | None = None

    def port(self, documented: int) -> int:
        """The test's port for a documented one (others unchanged)."""
        if documented == DOC_UPSTREAM_MQTT and self.upstream_mqtt is not None:
            return self.upstream_mqtt
        offset = documented - DOC_BASE_PORT
        broker, kind = divmod(offset, PORTS_PER_BROKER)
        if offset >= 0 and broker < DOC_BROKERS and kind < PORT_KINDS:
            return self.base_port + offset
        return documented

    def command(self, text: str) -> str:
        """``text`` made to run against the test's cluster (see the module docstring)."""
        text = _PORT.sub(lambda m: str(self.port(int(m.group(1)))), text)
        if re.search(r"\bcluster up\b", text):
            if "--base-port" not in text:
                text += f" --base-port {self.base_port}"
            if "--data-dir" not in text:
                text += " --data-dir cluster"
        text = _DATA_DIR.sub(lambda m: f"--data-dir {self.data_dir(m.group(1))}", text)
        return text

    def data_dir(self, documented: str) -> str:
        name = re.sub(r"[^\w.-]+", "_", documented.strip("/")) or "data"
        return str(self.scratch / name)


def free_port_block(count: int = DOC_BROKERS * PORTS_PER_BROKER) -> int:
    """A base port whose ``count`` following ports are all free now (bound, then released).

    Below the kernel's ephemeral range (where ``free_ports`` and outgoing connections take
    theirs), from a random start so that two runs at once rarely try the same block.
    """
    start = random.randrange(20000, 30000, 100)
    for base in list(range(start, 32000, 100)) + list(range(20000, start, 100)):
        if all(_free(port) for port in range(base, base + count)):
            return base
    raise RuntimeError("no free block of ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        # As the brokers' listeners do: ports in TIME_WAIT count as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
