"""Worker metrics: a mock engine's simulated KV moves are exported apart from wire bytes
(``splitserve_worker_simulated_kv_*``), so a dashboard summing ``splitserve_worker_kv_transfer_bytes`` never adds them."""

from __future__ import annotations

import pytest

from common.protocol import WorkerLoad
from services.worker.engine import EngineCounters
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.metrics import WorkerMetrics
from services.worker.config import WorkerConfig
from services.worker.service import WorkerService

LABELS = {"worker_id": "w", "role": "decode"}
COUNTERS = EngineCounters(num_transfers=2, num_transfer_bytes=183_000_000, transfer_seconds=(0.01, 0.02))


@pytest.mark.parametrize(("simulated", "counted", "absent"), [
    pytest.param(False, "splitserve_worker_kv", "splitserve_worker_simulated_kv", id="real"),
    pytest.param(True, "splitserve_worker_simulated_kv", "splitserve_worker_kv", id="simulated"),
])
def test_transfer_bytes_go_to_their_own_family(simulated: bool, counted: str, absent: str) -> None:
    metrics = WorkerMetrics("w", "decode", simulated_transfers=simulated)
    metrics.observe(WorkerLoad(), COUNTERS)
    value = metrics.registry.get_sample_value
    assert value(f"{counted}_transfer_bytes_total", LABELS) == 183_000_000
    assert value(f"{counted}_transfers_total", LABELS) == 2
    assert value(f"{counted}_transfer_seconds_count", LABELS) == 2
    assert value(f"{absent}_transfer_bytes_total", LABELS) is None
    assert value(f"{absent}_transfers_total", LABELS) is None


class _RealEngine:
    """Just enough of an engine for WorkerService's constructor; says nothing about simulated transfers."""

    block_size, num_blocks, max_model_len = 16, 8, 128


def test_the_worker_labels_a_mock_engines_transfers_simulated() -> None:
    config = WorkerConfig(worker_id="w", role="decode", model="m", router_endpoint="tcp://127.0.0.1:9")
    mock = WorkerService(config, MockEngine(MockEngineConfig(num_blocks=8, engine_id="w")))
    real = WorkerService(config, _RealEngine())  # type: ignore[arg-type]
    assert (mock.transfers_simulated, real.transfers_simulated) == (True, False)
    mock.metrics.observe(WorkerLoad(), COUNTERS)
    value = mock.metrics.registry.get_sample_value
    assert value("splitserve_worker_simulated_kv_transfer_bytes_total", LABELS) == 183_000_000
    assert value("splitserve_worker_kv_transfer_bytes_total", LABELS) is None
