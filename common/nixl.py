"""NIXL agents as every process here makes them: no progress thread, UCX without error handling, POSIX for files.

Why (measured on 2-core machines, nixl 1.5.1): a progress thread burns about half a core per idle agent and halves
bandwidth; ``ucx_error_handling_mode=none`` means UCX cannot notice a dead peer, so services keep their own
heartbeats. See docs/architecture.md, "NIXL facts".
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


@dataclass
class NixlHandle:
    agent: object  # nixl._api.nixl_agent
    name: str
    backends: tuple[str, ...]


def make_nixl_agent(name: str, backends: tuple[str, ...] = ("UCX", "POSIX")) -> NixlHandle | None:
    """A NIXL agent with the given backends (those that fail are skipped); None when NIXL is unusable."""
    try:
        from nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[]))
    except Exception as exc:  # not installed, or no UCX: inline bytes only
        log.warning("nixl_unavailable", error=repr(exc))
        return None
    made: list[str] = []
    for backend in backends:
        params = {"ucx_error_handling_mode": "none"} if backend == "UCX" else {}
        try:
            agent.create_backend(backend, params)
            made.append(backend)
        except Exception as exc:
            log.warning("nixl_backend_failed", backend=backend, error=repr(exc))
    if not made:
        log.warning("nixl_unavailable", error="no backend could be created")
        return None
    log.info("nixl_agent_ready", name=name, backends=made)
    return NixlHandle(agent, name, tuple(made))
