"""One side of the raw NIXL READ (bench/nixl_read.py) as a process of its own, e.g. inside a simulated host.

    python -m bench.lib.nixl_peer target|initiator FD

FD is an inherited socket to the launcher (``multiprocessing.connection.Connection`` framing): the first message
is the keyword arguments of ``nixl_read.target`` / ``nixl_read.initiator``; after that the same messages as
between the two processes of bench/nixl_read.py (the target's agent metadata and descriptors out, the
initiator's results back). The launcher relays the metadata: the agents learn about each other out of band,
as vLLM's side channel does, and move the bytes over whatever UCX finds between their hosts.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    role, fd = argv[0], int(argv[1])
    from bench import nixl_read

    conn = Connection(fd)
    kwargs = conn.recv()
    match role:
        case "target":
            nixl_read.target(conn, **kwargs)
        case "initiator":
            nixl_read.initiator(conn, **kwargs)
        case _:
            raise SystemExit(f"role must be target or initiator, not {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
