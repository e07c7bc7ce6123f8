"""Which KV connectors a vLLM worker asks for: NIXL alone, kvtier alone, or both through MultiConnector."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


def _config(**kw):
    from services.worker.engines.vllm.config import VllmEngineConfig
    from services.worker.engines.vllm.engine import VllmEngine

    return VllmEngine(VllmEngineConfig(model=Path("m"), engine_id="w1", hash_seed=7, **kw))._kv_transfer_config()


def test_without_kvtier_nixl_alone() -> None:
    cfg = _config(kv_role="decode")
    assert cfg.kv_connector == "NixlConnector" and cfg.kv_role == "kv_consumer"
    assert cfg.kv_load_failure_policy == "recompute"


@pytest.mark.parametrize("role", ["both", None])
def test_aggregated_with_kvtier_uses_ours_alone(role) -> None:
    cfg = _config(kv_role=role, kvtier_endpoint="tcp://127.0.0.1:1")
    assert cfg.kv_connector == "SplitserveTierConnector"
    assert cfg.kv_connector_module_path == "services.worker.engines.vllm.tier.connector"
    assert cfg.kv_connector_extra_config == {"kvtier_endpoint": "tcp://127.0.0.1:1", "hash_seed": 7,
                                             "worker_id": "w1", "write_through": True}
    assert cfg.kv_load_failure_policy == "recompute"


def test_prefill_and_decode_with_kvtier_use_multiconnector_nixl_first() -> None:
    for role, vllm_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        cfg = _config(kv_role=role, kvtier_endpoint="tcp://127.0.0.1:1", kvtier_write_through=False)
        assert cfg.kv_connector == "MultiConnector" and cfg.kv_role == vllm_role
        nixl, tier = cfg.kv_connector_extra_config["connectors"]
        assert nixl["kv_connector"] == "NixlConnector" and nixl["kv_role"] == vllm_role
        assert tier["kv_connector"] == "SplitserveTierConnector" and tier["kv_role"] == vllm_role
        assert tier["kv_connector_extra_config"]["write_through"] is False


def test_switchable_is_nixl_kv_both_with_or_without_kvtier() -> None:
    # A worker that may move between prefill and decode (SetRole) keeps NIXL whatever its role, beside kvtier.
    alone = _config(kv_role="both", switchable=True)
    assert alone.kv_connector == "NixlConnector" and alone.kv_role == "kv_both"
    with_tier = _config(kv_role="both", switchable=True, kvtier_endpoint="tcp://127.0.0.1:1")
    assert with_tier.kv_connector == "MultiConnector" and with_tier.kv_role == "kv_both"
    nixl, tier = with_tier.kv_connector_extra_config["connectors"]
    assert (nixl["kv_connector"], nixl["kv_role"]) == ("NixlConnector", "kv_both")
    assert (tier["kv_connector"], tier["kv_role"]) == ("SplitserveTierConnector", "kv_both")
