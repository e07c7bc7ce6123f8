"""The kvtier connector's client settings from ``kv_connector_extra_config`` (no vLLM import: testable alone).

The connector runs inside vLLM's engine-core and model-runner processes, which only see what the engine config
carries. CURVE keys travel as a path (``curve_dir``: the worker's own key directory, ``keys make``'s
``OUT/worker``), never as key material: vLLM logs its config, and a path there reveals nothing. Each process
loads the keys itself; a directory that is missing or has a secret readable by others fails the engine's start
(``SplitserveError``), as the worker's own ``--curve-dir`` check does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.kvtier.client import TierClientConfig
from common.security import load_curve_keys


def tier_client_config(extra: Mapping[str, Any]) -> TierClientConfig:
    """The connector's own-tier client: endpoint, worker id, probe timeout and (optional) CURVE keys."""
    curve_dir = str(extra.get("curve_dir") or "")
    return TierClientConfig(
        endpoint=str(extra["kvtier_endpoint"]), worker_id=str(extra.get("worker_id", "vllm")),
        model_id=int(extra.get("hash_seed", 0)),
        lookup_timeout_s=float(extra.get("lookup_timeout_s", 0.1)), max_pending_blocks=1024,
        curve=load_curve_keys(Path(curve_dir)) if curve_dir else None)
