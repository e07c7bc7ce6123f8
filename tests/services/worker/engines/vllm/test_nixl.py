"""What importing our vLLM worker extension does to vLLM's NIXL side, observed, not re-stated as a table.

vLLM imports services/worker/engines/vllm/nixl.py in its worker process; from then on (1) vLLM's NIXL worker can no
longer move the engine off its core, and (2) every NIXL agent vLLM builds gets the progress-thread settings of
its side of a READ. Both are checked on the real modules (vLLM's base_worker, nixl's bindings)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("nixl")

from services.worker.engines.vllm import nixl as ext  # noqa: E402  (importing it applies the patches)


def test_vllm_nixl_worker_cannot_repin_the_engine() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    before = os.sched_getaffinity(0)
    base_worker.os.sched_setaffinity(0, {max(before)})  # what vLLM's NIXL worker does on CPU
    assert os.sched_getaffinity(0) == before
    assert base_worker.os.getpid() == os.getpid()  # everything else is the real os module


def _real_bindings():
    from vllm.distributed.nixl_utils import NixlWrapper

    api = sys.modules[NixlWrapper.__module__]
    return api, sys.modules[api.nixlBind.__name__]


@pytest.mark.parametrize(("kv_role", "thread", "delay_us", "sync_rw"), [
    ("kv_consumer", False, 0, True),              # decode: drives its own READs; vLLM's handshake thread shares it
    ("kv_producer", True, ext.TARGET_DELAY_US, False),  # prefill: READs of its blocks wait on its progress
    (None, True, ext.TARGET_DELAY_US, False),     # an agent made outside vLLM's config
])
def test_agents_vllm_builds_get_the_settings_of_their_side(monkeypatch, kv_role, thread, delay_us, sync_rw) -> None:
    api, real = _real_bindings()
    made = []
    monkeypatch.setattr(real, "nixlAgent", lambda name, config: made.append(config) or "agent")
    monkeypatch.setattr(ext, "_current_kv_role", lambda: kv_role)
    config = real.nixlAgentConfig(True)  # what vLLM asks for: a progress thread, delay 0 (a spinning core)
    assert (config.useProgThread, config.pthrDelay) == (True, 0)
    assert api.nixlBind.nixlAgent("a", config) == "agent"  # vLLM's call goes through the patched bindings
    assert made == [config]
    assert config.useProgThread is thread
    if thread:
        assert config.pthrDelay == delay_us
    assert (config.syncMode == real.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW) is sync_rw
