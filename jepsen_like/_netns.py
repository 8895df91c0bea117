"""Linux network namespaces for a jepsen_like run: one namespace, veth pair and address per node.

Layout (``S`` = a subnet byte picked from the run's pid)::

    root namespace: bridge <prefix>b  10.77.S.1/24  (the harness: clients, proxies)
                         |  veth <prefix>h<i>  <->  <prefix>e<i> in namespace kqj-<tag>-n<i>
    node i:              10.77.S.(10+i)/24, lo up

A fault cuts traffic from node ``a`` to node ``b`` with a blackhole route to ``b``'s address in
``a``'s namespace (both routes for a two-way cut). The kernel on this machine has no netem and
there is no iptables, so latency and loss are left to the proxy layer (``_proxy``).

Every name carries a prefix made of ``kqj`` and the run's pid (base 36), so that ``cleanup_stale``
removes what a killed run left behind without touching a live run's devices. ``NetnsNetwork`` is
a context manager: whatever ``__enter__`` created, ``__exit__`` removes, also on errors.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from types import TracebackType

NAME_PREFIX = "kqj"
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message has its stderr."""


def _b36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
        if n == 0:
            return out


def netns_available() -> bool:
    """Whether this process can build namespaces: root, and iproute2 installed."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (ours or another user's): a stale run's holder test."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove namespaces and links of earlier runs whose process is gone; returns their names."""
    removed: list[str] = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{NAME_PREFIX}-([0-9a-z]+)-n\d+", name)
        if m and not pid_alive(int(m.group(1), 36)):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = re.fullmatch(rf"{NAME_PREFIX}([0-9a-z]+)(b|h\d+)", name)
        if m and not pid_alive(int(m.group(1), 36)):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet(pid: int) -> int:
    """A third byte ``S`` for 10.77.S.0/24 that no interface of this host uses (another run's)."""
    used = _ip("-o", "-4", "addr", "show", check=False)
    for k in range(224):
        subnet = 16 + (pid + k) % 224
        if f" 10.77.{subnet}." not in used:
            return subnet
    raise NetnsError("every 10.77.S.0/24 subnet is in use")


class NetnsNetwork:
    """The namespaces, veths and bridge of one run, and the route-based cuts between nodes."""

    def __init__(self, n: int, *, pid: int | None = None) -> None:
        pid = os.getpid() if pid is None else pid
        self.tag = _b36(pid)
        self.n = n
        self.subnet = _free_subnet(pid)
        self.bridge = f"{NAME_PREFIX}{self.tag}b"
        self._created_ns: list[str] = []
        self._created_links: list[str] = []
        self._cuts: set[tuple[int, int]] = set()
        if len(self.bridge) + 3 > 15:
            raise NetnsError(f"pid {pid} gives interface names longer than 15 characters")

    @property
    def host_address(self) -> str:
        """The harness's address on the bridge (proxies listen here)."""
        return f"10.77.{self.subnet}.1"

    def address(self, node: int) -> str:
        """Node ``node``'s address."""
        return f"10.77.{self.subnet}.{10 + node}"

    def namespace(self, node: int) -> str:
        return f"{NAME_PREFIX}-{self.tag}-n{node}"

    def exec_prefix(self, node: int) -> list[str]:
        """What to put before a command to run it inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def __enter__(self) -> NetnsNetwork:
        cleanup_stale()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._created_links.append(self.bridge)
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                self.add_node(i)
        except BaseException:
            self.close()
            raise
        return self

    def add_node(self, i: int) -> None:
        """Create node ``i``'s namespace and wire it to the bridge (also for a node added later)."""
        ns, host, inner = self.namespace(i), f"{NAME_PREFIX}{self.tag}h{i}", f"{self.tag}e{i}"
        _ip("netns", "add", ns)
        self._created_ns.append(ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", inner)
        self._created_links.append(host)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", host, "master", self.bridge)
        _ip("link", "set", host, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{self.address(i)}/24", "dev", inner)
        _ip("netns", "exec", ns, "ip", "link", "set", inner, "up")

    def cut(self, src: int, dst: int) -> None:
        """Drop every packet ``src`` sends to ``dst`` (one way; call twice for both)."""
        if (src, dst) in self._cuts:
            return
        _ip("netns", "exec", self.namespace(src), "ip", "route", "add", "blackhole",
            f"{self.address(dst)}/32")  # fmt: skip
        self._cuts.add((src, dst))

    def heal(self) -> None:
        """Remove every cut."""
        for src, dst in sorted(self._cuts):
            _ip("netns", "exec", self.namespace(src), "ip", "route", "del", "blackhole",
                f"{self.address(dst)}/32", check=False)  # fmt: skip
        self._cuts.clear()

    def close(self) -> None:
        """Remove everything this run created (namespaces take their veth ends with them)."""
        for ns in reversed(self._created_ns):
            _ip("netns", "del", ns, check=False)
        for link in reversed(self._created_links):
            _ip("link", "del", link, check=False)
        self._created_ns.clear()
        self._created_links.clear()
        self._cuts.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
