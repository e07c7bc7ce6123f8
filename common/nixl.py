"""NIXL agents as every process here makes them: no progress thread, UCX without error handling, POSIX for files.

Why (measured on 2-core machines, nixl 1.5.1): a progress thread burns about half a core per idle agent and halves
bandwidth; ``ucx_error_handling_mode=none`` means UCX cannot notice a dead peer, so services keep their own
heartbeats. See docs/architecture.md, "NIXL facts".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from common.errors import NixlUnavailable

log = structlog.get_logger(__name__)


@dataclass
class NixlHandle:
    agent: object  # nixl._api.nixl_agent
    name: str
    backends: tuple[str, ...]


def make_nixl_agent(name: str, backends: tuple[str, ...] = ("UCX", "POSIX"),
                    required: bool = False) -> NixlHandle | None:
    """A NIXL agent with the given backends (those that fail are skipped).

    Services degrade without one (kvtier: inline bytes only) and get None with a warning; ``required`` raises
    ``NixlUnavailable`` with the reason instead (tests where NIXL is installed: a broken install must fail them).
    """
    try:
        from nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[]))
    except Exception as exc:  # not installed, or no UCX
        return _unavailable(required, repr(exc), exc)
    made: list[str] = []
    for backend in backends:
        params = {"ucx_error_handling_mode": "none"} if backend == "UCX" else {}
        try:
            agent.create_backend(backend, params)
            made.append(backend)
        except Exception as exc:
            log.warning("nixl_backend_failed", backend=backend, error=repr(exc))
    if not made:
        return _unavailable(required, f"none of the backends {backends} could be created", None)
    log.info("nixl_agent_ready", name=name, backends=made)
    return NixlHandle(agent, name, tuple(made))


def _unavailable(required: bool, reason: str, exc: Exception | None) -> None:
    if required:
        raise NixlUnavailable(f"no NIXL agent: {reason}") from exc
    log.warning("nixl_unavailable", error=reason)
    return None


def run_xfer(agent: Any, handle: Any, timeout_s: float, what: str) -> None:
    """Post ``handle``'s transfer and poll it to the end (no progress thread: polling is what progresses it);
    ``TimeoutError`` past ``timeout_s``, ``OSError`` when NIXL reports ERR, each naming ``what``. The handle is
    released either way."""
    try:
        state = agent.transfer(handle)
        deadline = time.monotonic() + timeout_s
        while state not in ("DONE", "ERR"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"NIXL {what} timed out")
            state = agent.check_xfer_state(handle)
        if state == "ERR":
            raise OSError(f"NIXL {what} failed")
    finally:
        agent.release_xfer_handle(handle)
