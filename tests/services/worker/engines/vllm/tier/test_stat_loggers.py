"""vLLM's own stat loggers against every connector set the worker builds: a tier load must never kill the engine.

AsyncLLM always runs vLLM's Prometheus logger beside ours, and its logging logger at INFO. Both read the connector
stats the engine core sends (``to_dict()`` of what the connectors returned): under a MultiConnector the Prometheus
one asserted that every child with stats built metrics, and the logging one rebuilt children by registered name.
This drives those real vLLM classes with each configuration of ``VllmEngine._kv_transfer_config`` and the stats
each connector really produces.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

# (kv_role, kv_transfer, kvtier on, switchable): every shape of connector config the worker can build.
CASES = [
    ("both", "pull", True, False),    # aggregated with kvtier: the tier connector alone
    ("both", "pull", True, True),     # switchable (kv_both) with kvtier: NIXL pull + tier
    ("both", "push", True, True),     # switchable pushing: NIXL push + tier
    ("prefill", "pull", True, False),
    ("decode", "pull", True, False),
    ("prefill", "push", True, False),
    ("decode", "push", True, False),  # the `make serve` decode worker: NixlPushConnector + tier
    ("prefill", "push", False, False),
    ("decode", "pull", False, False),
]


def _engine(kv_role: str, kv_transfer: str, kvtier: bool, switchable: bool):
    from services.worker.engines.vllm.config import VllmEngineConfig
    from services.worker.engines.vllm.engine import VllmEngine

    config = VllmEngineConfig(model=Path("/nonexistent"), kv_role=kv_role, kv_transfer=kv_transfer,
                              switchable=switchable, kvtier_endpoint="tcp://127.0.0.1:1" if kvtier else "",
                              engine_id="e0")
    return VllmEngine(config)


def _stats_payload(ktc):
    """What the engine core sends after a step in which NIXL moved one prompt and the tier loaded two blocks."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

    from services.worker.engines.vllm.tier.connector import CONNECTOR_NAME
    from services.worker.engines.vllm.tier.stats import TierLoadStats

    tier = TierLoadStats()
    tier.record("host", 1 << 20, 0.002)
    tier.record("disk", 1 << 20, 0.004)
    nixl = NixlKVConnectorStats()
    # nixl's nixlXferTelemetry fields that vLLM reads (durations in microseconds), as in tests of the sink.
    nixl.record_transfer(SimpleNamespace(xferDuration=4000, postDuration=1000, totalBytes=4 << 20, descCount=12,
                                         startTime=0))
    if ktc.kv_connector == CONNECTOR_NAME:
        return tier.to_dict()
    if ktc.kv_connector == "MultiConnector":
        # MultiConnector keys each child's stats by its class name (NixlPullConnector, not the alias NixlConnector).
        classes = [KVConnectorFactory.get_connector_class(KVTransferConfig(**c))
                   for c in ktc.kv_connector_extra_config["connectors"]]
        return MultiKVConnectorStats(data={c.__name__: tier if c.__name__ == CONNECTOR_NAME else nixl
                                           for c in classes}).to_dict()
    return nixl.to_dict()


@pytest.mark.parametrize("kv_role,kv_transfer,kvtier,switchable", CASES)
def test_vllm_stat_loggers_take_every_connector_set(kv_role, kv_transfer, kvtier, switchable) -> None:
    from prometheus_client import REGISTRY
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging, KVConnectorProm
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    ktc = _engine(kv_role, kv_transfer, kvtier, switchable)._kv_transfer_config()
    assert (ktc.kv_connector in ("MultiConnector", "SplitserveTierConnector")) == kvtier
    vllm_config = VllmConfig(kv_transfer_config=ktc)
    payload = _stats_payload(ktc)
    unregister_vllm_metrics()
    prom = KVConnectorProm(vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]})
    prom.observe(payload, 0)  # raised AssertionError for a tier beside NIXL
    logging = KVConnectorLogging(ktc)
    logging.observe(payload)  # raised ValueError: connector not registered
    logging.log(log_fn=lambda *args: None)
    if kvtier:
        loaded = REGISTRY.get_sample_value("vllm:splitserve_kvtier_load_bytes_total",
                                           {"model_name": "tiny", "engine": "0", "tier": "host"})
        assert loaded == 1 << 20
    unregister_vllm_metrics()


def test_tier_metrics_skip_a_malformed_entry() -> None:
    from prometheus_client import REGISTRY
    from vllm.config import VllmConfig
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    from prometheus_client import Counter, Gauge, Histogram

    from services.worker.engines.vllm.tier.connector import SplitserveTierConnector
    from services.worker.engines.vllm.tier.stats import LOADS_KEY

    unregister_vllm_metrics()
    prom = SplitserveTierConnector.build_prom_metrics(VllmConfig(), {Gauge: Gauge, Counter: Counter,
                                                                     Histogram: Histogram}, ["engine"], {0: ["0"]})
    prom.observe({LOADS_KEY: [["host", "x", 0.1], "junk", ["disk", 10, 0.1]]}, 0)
    assert REGISTRY.get_sample_value("vllm:splitserve_kvtier_loads_total", {"engine": "0", "tier": "disk"}) == 1
    assert REGISTRY.get_sample_value("vllm:splitserve_kvtier_loads_total", {"engine": "0", "tier": "host"}) is None
    unregister_vllm_metrics()
