"""The live status page (`/dashboard`): workers by role with load and KV usage, transfers, recent latencies."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from common.errors import SplitserveError
from services.frontend.metrics import FrontendMetrics
from services.frontend.pipeline import Pipeline

_PAGE = Path(__file__).with_name("dashboard.html")


def percentile_ms(values, q: float) -> float | None:
    """Nearest-rank percentile of seconds, in ms; None for no data."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0, 3)


class Dashboard:
    def __init__(self, model_name: str, pipeline: Pipeline, metrics: FrontendMetrics) -> None:
        self._model = model_name
        self._pipeline = pipeline
        self._metrics = metrics
        self._page = _PAGE.read_bytes()

    def page(self) -> bytes:
        return self._page

    async def data(self) -> bytes:
        try:
            workers = await self._pipeline.worker_stats()
        except SplitserveError:
            workers = []
        rows = []
        for info, stats in workers:
            load = stats.load if stats is not None else None
            total = load.num_total_blocks if load else info.num_blocks
            rows.append({
                "worker_id": info.worker_id, "role": info.role, "switchable": info.switchable, "engine": info.engine,
                "endpoint": info.endpoint,
                "block_size": info.block_size,
                "responding": stats is not None,
                "running": load.num_running if load else None, "waiting": load.num_waiting if load else None,
                "kv_used_blocks": (total - load.num_free_blocks) if load else None, "kv_total_blocks": total,
                "kv_usage": round((total - load.num_free_blocks) / total, 4) if load and total else None,
                "prefix_hits": stats.num_prefix_hits if stats else None,
                "transfers": stats.num_transfers if stats else None,
                "transfer_failures": stats.num_transfer_failures if stats else None,
                "transfer_bytes": stats.num_transfer_bytes if stats else None,
                # The mock engine's transfers are simulated: their bytes never crossed a wire.
                "transfers_simulated": stats.transfers_simulated if stats else None,
            })
        m = self._metrics
        ttft, itl = list(m.recent_ttft_s), list(m.recent_itl_s)
        return orjson.dumps({
            "model": self._model, "time": time.time(),
            "workers": sorted(rows, key=lambda r: (r["role"], r["worker_id"])),
            "frontend": {
                "inflight": m.value("splitserve_frontend_inflight_requests"),
                "ttft_ms": {"p50": percentile_ms(ttft, 0.5), "p99": percentile_ms(ttft, 0.99), "n": len(ttft)},
                "itl_ms": {"p50": percentile_ms(itl, 0.5), "p99": percentile_ms(itl, 0.99), "n": len(itl)},
                "recent_ttft_ms": [round(v * 1000.0, 2) for v in ttft[-120:]],
                "prefill_remote": m.value("splitserve_frontend_prefill_decisions_total", where="remote"),
                "prefill_local": m.value("splitserve_frontend_prefill_decisions_total", where="local"),
                "migrations": m.value("splitserve_frontend_migrations_total"),
                "transfer_failures": m.value("splitserve_frontend_kv_transfer_failures_total"),
            },
        })
