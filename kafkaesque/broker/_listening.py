"""The TCP sockets a process really listens on, read from Linux's ``/proc`` (issue 39).

A listener's configured host and the address the kernel bound can differ: pysyncobj, for one,
binds the wildcard unless it is told otherwise. The safe-defaults check therefore looks at what
the kernel says, not at what the configuration asked for. ``/proc/<pid>/fd`` names the process's
socket inodes; ``/proc/<pid>/net/tcp`` and ``tcp6`` map inodes to local addresses and states.
"""

from __future__ import annotations

import ipaddress
import os
import struct

_LISTEN = "0A"  # TCP_LISTEN in the kernel's hex state column


def _socket_inodes(pid: str) -> set[str]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed between listdir and readlink
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _decode_host(hex_host: str) -> str:
    """``/proc/net/tcp*`` prints an address as host-order 32-bit words in hex."""
    raw = bytes.fromhex(hex_host)
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    packed = struct.pack(f">{len(words)}I", *words)
    # Not socket.inet_ntop: pysyncobj replaces it with a Windows shim when it is imported.
    address = ipaddress.ip_address(packed)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def listening_sockets(pid: int | None = None) -> list[tuple[str, int]]:
    """Every ``(host, port)`` on which process ``pid`` (default: this one) holds a listening TCP
    socket; the wildcard shows as ``0.0.0.0`` or ``::``. Raises ``OSError`` where ``/proc`` is
    not Linux's (callers decide whether that may pass)."""
    where = "self" if pid is None else str(pid)
    inodes = _socket_inodes(where)
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{where}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:  # a kernel without IPv6
            continue
        for row in rows:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state != _LISTEN or inode not in inodes:
                continue
            hex_host, hex_port = local.split(":")
            found.append((_decode_host(hex_host), int(hex_port, 16)))
    return found
