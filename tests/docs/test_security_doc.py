"""docs/security.md's walk-through, run as written: its ``sh`` blocks, in order, as one bash
script (the broker it starts in the background is used by the blocks after it, and stopped by
the last), in an empty directory, on free ports (``_rewrite``).

After the command that starts the broker the test adds one line of its own: a wait until the
broker answers METADATA as the walk-through's super user, which a reader does by eye. Every line
of the walk-through's ``text`` blocks (what its commands print) must be in the script's output.

``COMMANDS`` is every command the page documents: test_doc_commands.py's registry names this
test for each, and the first test here checks that the page still has exactly these.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from kafkaesque.client import Client, KafkaesqueError, Security
from kafkaesque.local_cluster import one_attempt
from tests.docs._blocks import commands, parse_blocks, read_blocks
from tests.docs._procs import ROOT, Env, kill_marked, run_script
from tests.docs._rewrite import Rewriter, free_port_block

DOC = "docs/security.md"
TEST = "tests/docs/test_security_doc.py::test_the_walk_through_runs_as_written"

COMMANDS = (
    'openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -days 365 -subj "/CN=Kafkaesque CA" -keyout ca-key.pem -out ca.pem',  # noqa: E501
    'openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=broker-0" -keyout broker-0-key.pem -out broker-0.csr',  # noqa: E501
    "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,clientAuth\\n' > broker-0.ext",  # noqa: E501
    "openssl x509 -req -in broker-0.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 365 -extfile broker-0.ext -out broker-0.pem",  # noqa: E501
    "KAFKAESQUE_PASSWORD=admin-secret kafkaesque user add admin --users-file users",
    "KAFKAESQUE_PASSWORD=alice-secret kafkaesque user add alice --users-file users",
    "KAFKAESQUE_PASSWORD=bob-secret kafkaesque user add bob --users-file users",
    "kafkaesque user list --users-file users",
    'export KAFKAESQUE_CLUSTER_SECRET="$(openssl rand -base64 32)"',
    "kafkaesque broker --id 0 --data-dir data --client 127.0.0.1:9092 --peers 0@127.0.0.1:9093 --controllers 0@127.0.0.1:9094 --tls-cert broker-0.pem --tls-key broker-0-key.pem --tls-ca ca.pem --client-tls --peer-tls --users-file users --super-users User:admin --admin 127.0.0.1:9095 &",  # noqa: E501
    "printf 'PING\\r\\nLIST\\r\\nQUIT\\r\\n' | openssl s_client -quiet -verify_return_error -CAfile ca.pem -connect 127.0.0.1:9092 -ign_eof",  # noqa: E501
    "export KAFKAESQUE_BOOTSTRAP=127.0.0.1:9092 KAFKAESQUE_USER=admin KAFKAESQUE_PASSWORD=admin-secret",  # noqa: E501
    "kafkaesque topic create orders --partitions 1 --replication-factor 1 --tls-ca ca.pem",
    "kafkaesque acl add --principal User:alice --allow --operation write --topic orders --tls-ca ca.pem",  # noqa: E501
    "kafkaesque acl list --tls-ca ca.pem",
    "echo 'order 1' | KAFKAESQUE_USER=alice KAFKAESQUE_PASSWORD=alice-secret kafkaesque produce orders --tls-ca ca.pem",  # noqa: E501
    "printf 'AUTH PLAIN %s\\r\\nPUBS orders order-2\\r\\nQUIT\\r\\n' \"$(printf '\\0bob\\0bob-secret' | base64)\" | openssl s_client -quiet -verify_return_error -CAfile ca.pem -connect 127.0.0.1:9092 -ign_eof",  # noqa: E501
    "curl -s http://127.0.0.1:9095/metrics | grep '^kafkaesque_authorization_failures_total{operation=\"write\"}'",  # noqa: E501
    "kill %1; wait",
)

_SCRIPT_TIMEOUT_S = 300.0
_READY_TIMEOUT_S = 120.0
_BROKER = re.compile(r"^kafkaesque broker .*&$")
# Output of the walk-through's own commands that the page states in prose or in text blocks.
_STATED = (
    "+OK PONG",
    "-ERR NOT_AUTHORIZED authentication required: AUTH SCRAM-SHA-256 first (docs/security.md)",
    "+OK authenticated bob",
    "-ERR NOT_AUTHORIZED User:bob may not write topic orders",
    "+OK bye",
)


def _documented() -> list[str]:
    return [c.text for b in read_blocks(ROOT, DOC) if b.is_shell for c in commands(b)]


def _walk_through_output() -> list[str]:
    """The lines of the ``text`` blocks of the walk-through (what its commands print)."""
    text = (ROOT / DOC).read_text(encoding="utf-8").split("\n## Reference", 1)[0]
    return [line for b in parse_blocks(DOC, text) if b.tag == "text" for line in b.lines]


def test_the_page_documents_exactly_these_commands() -> None:
    assert tuple(_documented()) == COMMANDS


def wait_ready(port: int, ca: str, deadline_s: float = _READY_TIMEOUT_S) -> None:
    """Until the broker on 127.0.0.1:``port`` answers METADATA with itself registered, asked
    over TLS (``ca``) as the walk-through's super user; SystemExit with the last answer after
    ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        security = Security("SASL_SSL", username="admin", password="admin-secret", ssl_cafile=ca)
        try:
            with Client.pinned(("127.0.0.1", port), config=one_attempt(5, security)) as client:
                metadata = client.refresh_metadata()
            if 0 in metadata.brokers:
                return
            last = f"registered: {sorted(metadata.brokers)}"
        except KafkaesqueError as exc:
            last = str(exc)
        time.sleep(0.3)
    raise SystemExit(f"the broker did not become ready in {deadline_s:.0f} s: {last}")


def _wait_ready_line(port: int) -> str:
    """The bash line the test adds after the broker's start: ``wait_ready`` in a process."""
    module = "tests.docs.test_security_doc"
    return f"PYTHONPATH={shlex.quote(str(ROOT))} {shlex.quote(sys.executable)} -m {module} {port}"


def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    rewriter = Rewriter(free_port_block(), tmp_path)
    cwd = tmp_path / "walk-through"
    cwd.mkdir()
    lines = []
    for text in _documented():
        lines.append(rewriter.command(text))
        if _BROKER.match(text):
            lines.append(_wait_ready_line(rewriter.port(9092)))
    marker = str(tmp_path)
    env = Env(marker, f"127.0.0.1:{rewriter.port(9092)}")
    began = time.monotonic()
    try:
        result = run_script("\n".join(lines), env, _SCRIPT_TIMEOUT_S, cwd)
    finally:
        leftovers = kill_marked(marker)
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"exit {result.returncode} after {time.monotonic() - began:.0f} s:\n{output}"
    )
    assert not leftovers, f"the walk-through left processes running: {leftovers}"
    for text in (*_STATED, *_walk_through_output()):
        assert text in output, f"no {text!r} in:\n{output}"
    # Step 2: the users file holds no password; step 5: the ACL is listed; step 6: alice wrote.
    users = (cwd / "users").read_text()
    assert "admin" in users and "secret" not in users
    assert re.search(r"User:alice\s+allow\s+write\s+topic\s+literal\s+orders", output), output
    assert "produced 1 of 1 records" in output, output


@pytest.mark.parametrize("page", ["README.md", "docs/operations.md"])
def test_the_page_is_linked(page: str) -> None:
    assert "security.md" in (ROOT / page).read_text()


if __name__ == "__main__":
    wait_ready(int(sys.argv[1]), "ca.pem")
