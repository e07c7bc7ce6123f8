"""vLLM's NixlConnector on CPU, fixed for one-core-per-engine: keep the engine's core, no spinning thread.

1. Core pinning. On CPU, vLLM 0.32's NIXL worker (``base_worker.py``, "reserve different cores for
start_load_kv() from model_forward()") calls ``os.sched_setaffinity(0, [last core of each NUMA node])`` from
the thread that runs the model, after vLLM bound it to ``VLLM_CPU_OMP_THREADS_BIND``. With one engine per
core that moves every engine's compute thread to the machine's last core: measured here, the prefill
engine's main thread ran on core 1 next to the decode engine (both bound elsewhere by env: 0 and 1), so a
long prefill in the "disaggregated" graph stole the decode engine's core, and the two aggregated engines
shared one core too. We make that call a no-op (``base_worker``'s ``os`` is replaced by a proxy), so the
engine keeps the core it was given.

2. Progress thread.

vLLM 0.32's NixlConnector builds its agent with ``nixl_agent_config(num_threads=4, capture_telemetry=True)``,
so the progress thread is on, and nixl 1.5.1's Python agent hard-codes the thread's delay to 0: the UCX
backend's shared progress thread (``nixlUcxSharedThread::run``, ``poll(..., timeout=0)``) burns a whole core
per engine, idle or not (measured here: ~0.8-1.0 core per VLLM::Worker process with no requests). On a 2-core
machine that is one core taken from the engines' compute: a 2,000-token prefill took 30-40 s instead of ~2 s
and decode steps of the steady streams slowed (bench/interference.py).

The thread cannot simply be turned off: vLLM's prefill engine does not poll NIXL while idle, so without it the
decode side's READ never completes its wire-up and the blocks expire (seen: "Releasing expired KV blocks ...
retrieved by 0 remote worker(s)"). Instead the agent is made with a delay: the thread then sleeps up to that
long between UCX polls, and the delay depends on which side of a READ the engine is on:

- READ target (prefill, ``kv_producer``; and ``kv_both``): ``TARGET_DELAY_US`` = 1 ms. A decode engine's READ
  of this engine's blocks waits on this engine's progress, and a busy prefill engine's own thread is inside a
  forward pass for seconds: with a 100 ms delay a 24.8 MB READ took 43-47 ms under load (10 prompts, twice).
  Idle cost at 1 ms: ~3% of a core.
- READ initiator (decode, ``kv_consumer``): ``INITIATOR_DELAY_US`` = 100 ms. The engine thread drives its own
  READs (vLLM polls ``check_xfer_state`` every step) and the thread shares the engine's one core: each wake-up
  contends with the engine thread for the UCX worker in the middle of a READ. Measured (100M model bf16,
  2,000-token prompts, 24.8 MB in 12-24 merged descriptors): idle graph, READ 5.5-15 ms at 1 ms, 3.5-4.3 ms at
  100 ms; under load (8 decoding streams, a long prompt every 3 s, bench/interference.py) 11 ms (2.2 GB/s) at
  1 ms, 5.8 ms (4.2 GB/s) at 100 ms.

vLLM offers no setting for it, so the engine names this module's class as vLLM's ``worker_extension_cls``:
vLLM imports it in the worker process before it creates the KV connector, and importing it makes every nixl
agent built by ``nixl._api.nixl_agent`` use the delay.
"""

from __future__ import annotations

import sys
import types
from typing import Any

QUALNAME = "services.worker.vllm_nixl.SleepingNixlProgressThread"
TARGET_DELAY_US = 1000
INITIATOR_DELAY_US = 100_000


def _keep_core() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    real_os = base_worker.os
    if getattr(real_os, "_splitserve_keep_core", False):
        return

    class _Os(types.ModuleType):
        _splitserve_keep_core = True

        def __getattr__(self, name: str) -> Any:
            return getattr(real_os, name)

        @staticmethod
        def sched_setaffinity(pid: int, cpus: Any) -> None:  # the NIXL worker's re-pinning: ignored
            return None

    base_worker.os = _Os("os")


def progress_delay_us(kv_role: str | None) -> int:
    """The progress thread's delay for an engine on this side of a READ (see the module docstring)."""
    return INITIATOR_DELAY_US if kv_role == "kv_consumer" else TARGET_DELAY_US


def _current_kv_role() -> str | None:
    # vLLM builds the KV connector (and its agent) inside set_current_vllm_config.
    try:
        from vllm.config import get_current_vllm_config

        kv = get_current_vllm_config().kv_transfer_config
    except Exception:  # noqa: BLE001 - no current config (an agent made outside vLLM): the target's delay
        return None
    return kv.kv_role if kv is not None else None


def _patch() -> bool:
    try:
        from vllm.distributed.nixl_utils import NixlWrapper
    except ImportError:
        return False
    if NixlWrapper is None:
        return False
    api = sys.modules[NixlWrapper.__module__]  # nixl._api (nixl_cu12._api here): builds nixlAgentConfig inline
    real = getattr(api, "nixlBind", None)
    if real is None or getattr(real, "_splitserve_patched", False):
        return False

    class _Bindings(types.ModuleType):
        """nixl's bindings module, except that agents get a progress-thread delay instead of 0."""

        _splitserve_patched = True

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    def nixl_agent(name: str, config: Any) -> Any:
        delay_us = progress_delay_us(_current_kv_role())
        if getattr(config, "useProgThread", False) and config.pthrDelay < delay_us:
            config.pthrDelay = delay_us
        return real.nixlAgent(name, config)

    bindings = _Bindings(real.__name__)
    bindings.nixlAgent = nixl_agent  # type: ignore[attr-defined]
    api.nixlBind = bindings
    return True


_keep_core()
_patch()


class SleepingNixlProgressThread:
    """Empty worker extension: vLLM imports this module in its worker process, which applies the patches."""
