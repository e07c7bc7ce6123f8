"""Ports `up` hands its children: free now, outside the kernel's ephemeral range, never twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_handed_out: set[int] = set()  # ports this process chose and a child has not necessarily bound yet


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, for a child to bind later, outside the kernel's ephemeral range.

    Between our check and the child's bind, any process binding port 0 (vLLM's own ZeroMQ sockets, UCX) could
    be handed an ephemeral port; one of ours outside that range cannot be (seen in CI: a NIXL side-channel port
    taken, "Address already in use", the engine never ready). Never the same port twice per launcher.
    """
    lo, _ = _ephemeral_range()
    first = 10_000
    for _ in range(200):
        port = random.randrange(first, lo) if lo - first > 1000 else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} below {lo}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_in_use(host: str, port: int) -> bool:
    """Whether a server could not bind ``host:port`` now (with SO_REUSEADDR, as HTTP servers bind)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return False  # an unresolvable host: the frontend reports it
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            return True
    return False
