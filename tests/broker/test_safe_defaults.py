"""Safe defaults (issue 25): a broker that listens beyond loopback without authentication, or
with the built-in development secret, refuses to start unless ``--insecure``; a broker without
a users file says at start that anyone who reaches its port may do anything."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkaesque.broker import BrokerConfig, ConfigError, config_from_mapping
from kafkaesque.broker._config import (
    DEV_CLUSTER_SECRET,
    Address,
    check_exposure,
    is_loopback,
)
from kafkaesque.broker._listening import listening_sockets
from kafkaesque.local_cluster import free_ports

_START_TIMEOUT_S = 60.0


def config(**changes: Any) -> BrokerConfig:
    values: dict[str, Any] = {
        "id": 0,
        "data_dir": "data",
        "client": "127.0.0.1:9092",
        "peers": "0@127.0.0.1:9093,1@10.0.0.2:9093",
        "controllers": "0@127.0.0.1:9094,1@10.0.0.2:9094",
        **changes,
    }
    return config_from_mapping(values)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("192.168.1.5", False),
        ("broker-1.example.com", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_loopback_only_starts_open_with_the_dev_secret() -> None:
    check_exposure(config())  # the other brokers' addresses are theirs to check


@pytest.mark.parametrize(
    "setting",
    ["client", "admin", "peers", "controllers", "mqtt", "mqtt_tls", "mqtt_ws", "kafka", "http"],
)
def test_each_listener_beyond_loopback_without_authentication_is_refused(setting: str) -> None:
    wildcard = {
        "client": {"client": "0.0.0.0:9092"},
        "admin": {"admin": "0.0.0.0:9095"},
        "peers": {"peers": "0@0.0.0.0:9093"},
        "controllers": {"controllers": "0@10.1.1.1:9094"},
        "mqtt": {"mqtt": "[::]:1883"},
        "mqtt_tls": {"mqtt_tls": "0.0.0.0:8883", "mqtt_tls_cert": "cert.pem"},
        "mqtt_ws": {"mqtt_ws": "0.0.0.0:8080"},
        "kafka": {"kafka": "0.0.0.0:9192"},  # (with a users file: SASL on the Kafka port)
        "http": {"http": "0.0.0.0:9292"},  # (with a users file: HTTP Basic over HTTPS)
    }[setting]
    base: dict[str, Any] = {"cluster_secret": "s3cret"}
    if setting in ("peers", "controllers"):  # the two lists must name the same brokers
        base |= {"peers": "0@127.0.0.1:9093", "controllers": "0@127.0.0.1:9094"}
    base |= wildcard
    with pytest.raises(ConfigError, match=rf"^{setting} listens on .* without authentication.*"):
        check_exposure(config(**base))
    with pytest.raises(ConfigError, match="--insecure"):
        check_exposure(config(**base))
    check_exposure(config(**base, insecure=True))
    users = config(**base, users_file="users.txt")
    if setting.startswith("mqtt"):  # devices authenticate with their own file
        with pytest.raises(ConfigError, match=rf"^{setting} .*anonymous devices.*--insecure"):
            check_exposure(users)
        check_exposure(config(**base, users_file="u", mqtt_users="m"))
    else:
        check_exposure(users)


def test_the_development_secret_beyond_loopback_is_refused_even_with_users() -> None:
    exposed = config(client="0.0.0.0:9092", users_file="users.txt")
    assert exposed.cluster_secret == DEV_CLUSTER_SECRET
    with pytest.raises(ConfigError, match=r"^client .*development cluster secret.*--insecure"):
        check_exposure(exposed)
    check_exposure(config(client="0.0.0.0:9092", users_file="users.txt", insecure=True))


# -- the real command -----------------------------------------------------------------------------


def broker_command(data: Path, client: str, *extra: str) -> list[str]:
    peer, controller = free_ports(2)
    return [
        sys.executable, "-m", "kafkaesque.cli", "broker",
        "--id", "0",
        "--data-dir", str(data),
        "--client", client,
        "--peers", f"0@127.0.0.1:{peer}",
        "--controllers", f"0@127.0.0.1:{controller}",
        "--exit-with-parent",
        *extra,
    ]  # fmt: skip


def environment(secret: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KAFKAESQUE_CLUSTER_SECRET", None)
    if secret is not None:
        env["KAFKAESQUE_CLUSTER_SECRET"] = secret
    return env


def refused(command: list[str], secret: str | None = None) -> str:
    """Run a broker that must refuse to start: its stderr."""
    result = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=_START_TIMEOUT_S,
        env=environment(secret),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0, result.stdout
    assert "ready" not in result.stdout
    return result.stderr


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Brokers a test started; interrupted and waited for at the end, whatever happened."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_ready(
    procs: list[subprocess.Popen[str]], command: list[str]
) -> tuple[subprocess.Popen[str], str]:
    """Start a broker and wait for its ``ready`` line (bounded): (the process, its stdout)."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=environment(None),
    )
    procs.append(proc)
    assert proc.stdout is not None
    lines = []
    for _ in range(10):  # the listening line, then "ready"
        line = proc.stdout.readline()
        lines.append(line)
        if not line or line.strip() == "ready":
            break
    assert lines[-1].strip() == "ready", lines
    return proc, "".join(lines)


def start(procs: list[subprocess.Popen[str]], command: list[str]) -> tuple[str, str]:
    """Start a broker, wait for its ``ready`` line (bounded), stop it: (stdout, stderr)."""
    proc, lines = start_ready(procs, command)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=_START_TIMEOUT_S)
    return lines + out, err


def test_a_wildcard_client_port_without_users_refuses_to_start(tmp_path: Path) -> None:
    err = refused(broker_command(tmp_path, "0.0.0.0:0"), secret="not-the-dev-one")
    assert "client listens on 0.0.0.0:0, beyond loopback, without authentication" in err
    assert "--users-file" in err and "--insecure" in err
    assert "Traceback" not in err


def test_the_development_secret_beyond_loopback_refuses_to_start(tmp_path: Path) -> None:
    users = tmp_path / "users.txt"
    users.write_text("")
    err = refused(broker_command(tmp_path, "0.0.0.0:0", "--users-file", str(users)))
    assert "development cluster secret" in err and "--insecure" in err


def test_insecure_starts_on_the_wildcard_and_says_it_is_open(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    _, err = start(started, broker_command(tmp_path, "0.0.0.0:0", "--insecure"))
    assert "broker 0: no --users-file: anyone who can reach 0.0.0.0:" in err
    assert "may do anything (--insecure: beyond loopback too)" in err


def test_a_loopback_broker_without_users_starts_and_says_so(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    [port] = free_ports(1)
    out, err = start(started, broker_command(tmp_path, f"127.0.0.1:{port}"))
    assert f"client=127.0.0.1:{port}" in out
    line = (
        f"broker 0: no --users-file: anyone who can reach 127.0.0.1:{port} may do anything "
        "(listening on loopback only)"
    )
    assert line in err.splitlines()  # printed as one line of its own (and logged)


# -- what the kernel really bound (issue 39) ---------------------------------------------


def test_a_listener_bound_wider_than_configured_is_refused() -> None:
    """The check of the addresses the kernel bound: a loopback configuration whose controller
    port was bound on the wildcard (pysyncobj's default) is exposed, whatever the config says."""
    loopback = config(peers="0@127.0.0.1:9093", controllers="0@127.0.0.1:9094")
    check_exposure(loopback)
    bound = [
        ("client", Address("127.0.0.1", 9092)),
        ("controllers", Address("0.0.0.0", 9094)),
    ]
    with pytest.raises(ConfigError, match=r"^controllers listens on 0\.0\.0\.0:9094, beyond"):
        check_exposure(loopback, bound)
    check_exposure(loopback, [("controllers", Address("127.0.0.1", 9094))])


def test_listening_sockets_reads_what_the_kernel_bound() -> None:
    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::", 0))
        v6.listen()
        v4_port, v6_port = v4.getsockname()[1], v6.getsockname()[1]
        found = set(listening_sockets())
        assert ("127.0.0.1", v4_port) in found
        assert ("::", v6_port) in found
    assert ("127.0.0.1", v4_port) not in set(listening_sockets())


def _listening_of(pid: int) -> list[str]:
    """Every local address on which process ``pid`` listens, as ``ss`` prints it."""
    out = subprocess.run(
        ["ss", "-H", "-ltnp"], check=True, capture_output=True, text=True, timeout=10
    ).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_a_loopback_broker_listens_on_loopback_only(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    """Every listening socket of a broker started with loopback settings (client, peers,
    controllers, admin, MQTT) is on loopback: the controller's pysyncobj port was on 0.0.0.0."""
    admin, mqtt = free_ports(2)
    command = broker_command(
        tmp_path, "127.0.0.1:0", "--admin", f"127.0.0.1:{admin}", "--mqtt", f"127.0.0.1:{mqtt}"
    )
    proc, _ = start_ready(started, command)
    listening = _listening_of(proc.pid)
    assert len(listening) >= 5, listening  # client, peers, controllers, admin, MQTT
    assert all(is_loopback(address.rpartition(":")[0]) for address in listening), listening
