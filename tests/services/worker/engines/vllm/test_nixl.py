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


@pytest.mark.parametrize(("kv_role", "mode", "thread", "delay_us", "sync_rw"), [
    ("kv_consumer", "pull", False, 0, True),   # decode: drives its own READs; vLLM's handshake thread shares it
    ("kv_producer", "pull", True, ext.TARGET_DELAY_US, False),  # prefill: READs of its blocks wait on its progress
    (None, "pull", True, ext.TARGET_DELAY_US, False),     # an agent made outside vLLM's config
    # Push: the prefill engine WRITEs (initiator, no thread), the decode engine is the target; vLLM's push
    # writer thread shares both agents with the engine thread.
    ("kv_producer", "push", False, 0, True),
    ("kv_consumer", "push", True, ext.TARGET_DELAY_US, True),
    ("kv_both", "push", True, ext.TARGET_DELAY_US, True),
])
def test_agents_vllm_builds_get_the_settings_of_their_side(monkeypatch, kv_role, mode, thread, delay_us,
                                                           sync_rw) -> None:
    api, real = _real_bindings()
    made = []
    monkeypatch.setattr(real, "nixlAgent", lambda name, config: made.append(config) or "agent")
    monkeypatch.setattr(ext, "_current_kv", lambda: (kv_role, mode))
    config = real.nixlAgentConfig(True)  # what vLLM asks for: a progress thread, delay 0 (a spinning core)
    assert (config.useProgThread, config.pthrDelay) == (True, 0)
    assert api.nixlBind.nixlAgent("a", config) == "agent"  # vLLM's call goes through the patched bindings
    assert made == [config]
    assert config.useProgThread is thread
    if thread:
        assert config.pthrDelay == delay_us
    assert (config.syncMode == real.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW) is sync_rw


@pytest.mark.parametrize(("connector", "extra", "mode"), [
    ("NixlConnector", {}, "pull"),
    ("NixlPushConnector", {}, "push"),
    # kvtier beside NIXL: vLLM's MultiConnector names its children in the extra config.
    ("MultiConnector", {"connectors": [{"kv_connector": "NixlPushConnector", "kv_role": "kv_consumer"},
                                         {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"}]}, "push"),
    ("MultiConnector", {"connectors": [{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
                                         {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer"}]}, "pull"),
])
def test_the_transfer_mode_is_read_off_the_config_vllm_is_building(connector, extra, mode) -> None:
    from vllm.config import KVTransferConfig, VllmConfig, set_current_vllm_config

    kv = KVTransferConfig(kv_connector=connector, kv_role="kv_consumer", kv_connector_extra_config=extra)
    with set_current_vllm_config(VllmConfig(kv_transfer_config=kv)):
        assert ext._current_kv() == ("kv_consumer", mode)
