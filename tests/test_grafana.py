"""The Grafana dashboard only charts metrics the services really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from services.frontend.metrics import FrontendMetrics
from services.kvtier.metrics import KvTierMetrics
from services.router.metrics import RouterMetrics
from services.worker.metrics import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "splitserve.json"


def exported_names() -> set[str]:
    worker = WorkerMetrics("w", "decode")
    registries = [FrontendMetrics().registry, RouterMetrics().registry, worker.registry, KvTierMetrics().registry]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
            # Histograms with no observation yet still export _bucket; counters export _total.
            names.update({family.name, f"{family.name}_total", f"{family.name}_bucket"})
    return names


def test_every_charted_metric_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    charted = {name for e in exprs for name in re.findall(r"splitserve_[a-z_]+", e)}
    assert len(charted) >= 15
    missing = charted - exported_names()
    assert not missing, f"dashboard charts metrics nobody exports: {sorted(missing)}"
