"""vLLM's NIXL connectors (pull and push) on CPU, fixed for one-core-per-engine: keep the engine's core, no
spinning thread.

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

What the thread is for depends on the engine's side of a READ:

- READ target (prefill, ``kv_producer``; and ``kv_both``): the thread stays, with a delay of
  ``TARGET_DELAY_US`` = 1 ms between UCX polls. A decode engine's READ of this engine's blocks waits on this
  engine's progress (wire-up, notifications), and vLLM's prefill engine does not poll NIXL while idle or while
  its thread is inside a seconds-long forward pass: without the thread the blocks expired ("Releasing expired
  KV blocks ... retrieved by 0 remote worker(s)"); with a 100 ms delay a 24.8 MB READ took 43-47 ms under load.
  Idle cost at 1 ms: ~3% of a core.
- READ initiator (decode, ``kv_consumer``): no thread. On CPU the whole UCX/CMA READ runs inside
  ``transfer()`` on the engine thread, and vLLM polls ``check_xfer_state`` and the notifications every step.
  A thread here shares the engine's one core and wakes up during every READ to contend for the UCX worker:
  measured per READ (100M model bf16, 2,000-token prompt, 24.8 MB in 12-24 merged descriptors, 8 decoding
  streams, a long prompt every 3 s): with the thread (even at a 100 ms delay) the engine thread sat 2-11 ms in
  the run queue while that thread ran 2.7-10.6 ms, READ 5-16 ms; without it 0.2-0.7 ms in the run queue, READ
  2.2-5.1 ms. vLLM calls the agent from its handshake thread too, so this agent serializes its own calls
  (``NIXL_THREAD_SYNC_RW``; vLLM's default mode does not).

Push (``NixlPushConnector``) turns the sides around: the prefill engine WRITEs, the decode engine is the target.
The same rule follows the transfer, not the role: the WRITE initiator (prefill) runs without a thread, the
target (decode, and ``kv_both``) keeps one at 1 ms. Both sides then share their agent between threads: vLLM's
``nixl-push-writer`` thread sends and receives the notifications and posts the WRITEs while the engine thread
polls transfer states, so every push agent serializes its calls (``NIXL_THREAD_SYNC_RW``).

vLLM offers no setting for either, so the engine names this module's class as vLLM's ``worker_extension_cls``:
vLLM imports it in the worker process before it creates the KV connector, and importing it makes every nixl
agent built by ``nixl._api.nixl_agent`` take these settings.

3. Push destinations. Importing this module also makes vLLM's push WRITEs name the decode engine they went into,
in vLLM's NIXL stats (services/worker/engines/vllm/push_peers.py), so a push teaches the router its link as a pull
does.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

from services.worker.engines.vllm.lease_release import KvLeaseRelease
from services.worker.engines.vllm.push_peers import tag_vllm_push_writes

QUALNAME = "services.worker.engines.vllm.nixl.SleepingNixlProgressThread"
TARGET_DELAY_US = 1000


@dataclass(frozen=True, slots=True)
class ProgressThread:
    """How an engine's NIXL agent progresses transfers in the background (see the module docstring)."""

    enabled: bool
    delay_us: int = 0
    # Serialize the agent's calls (NIXL_THREAD_SYNC_RW): more than one thread uses it.
    sync_rw: bool = False


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


def progress_thread_for(kv_role: str | None, mode: str = "pull") -> ProgressThread:
    """The settings of an agent on its side of a transfer: ``mode`` "pull" (READ) or "push" (WRITE)."""
    initiator = "kv_producer" if mode == "push" else "kv_consumer"
    if kv_role == initiator:  # drives its own transfers
        return ProgressThread(enabled=False, sync_rw=True)
    return ProgressThread(enabled=True, delay_us=TARGET_DELAY_US, sync_rw=mode == "push")


def _current_kv() -> tuple[str | None, str]:
    """The KV role and transfer mode ("pull" or "push") of the vLLM config being built."""
    # vLLM builds the KV connector (and its agent) inside set_current_vllm_config.
    try:
        from vllm.config import get_current_vllm_config

        kv = get_current_vllm_config().kv_transfer_config
    except Exception:  # noqa: BLE001 - no current config (an agent made outside vLLM): a target's thread
        return None, "pull"
    if kv is None:
        return None, "pull"
    # Our kvtier connector may sit beside NIXL in a MultiConnector: the NIXL child names the mode.
    names = [kv.kv_connector] + [c.get("kv_connector") for c in
                                 (kv.kv_connector_extra_config or {}).get("connectors", ())]
    return kv.kv_role, "push" if "NixlPushConnector" in names else "pull"


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
        """nixl's bindings module, except that agents get our progress-thread settings."""

        _splitserve_patched = True

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    def nixl_agent(name: str, config: Any) -> Any:
        thread = progress_thread_for(*_current_kv())
        if not thread.enabled:
            config.useProgThread = False
        elif getattr(config, "useProgThread", False) and config.pthrDelay < thread.delay_us:
            config.pthrDelay = thread.delay_us
        if thread.sync_rw:
            config.syncMode = real.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
        return real.nixlAgent(name, config)

    bindings = _Bindings(real.__name__)
    bindings.nixlAgent = nixl_agent  # type: ignore[attr-defined]
    api.nixlBind = bindings
    return True


_keep_core()
_patch()
tag_vllm_push_writes()


class SleepingNixlProgressThread(KvLeaseRelease):
    """The worker extension: vLLM imports this module in its worker process, which applies the patches; its
    method releases a finished prefill's KV lease (lease_release.py)."""
