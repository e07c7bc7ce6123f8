"""The engine profile document: what ``splitserve profile`` writes and the planner and ``--mock-profile`` read.

The JSON (``PROFILE_KIND``, version 1) holds ``conditions``, the raw ``prefill`` and ``decode`` samples,
``timing`` (TimingModel field names, so ``TimingModel.from_profile(doc["timing"])`` works) and ``fit``
(the fitted model's worst relative error per curve). ``load_timing`` reads it for ``--mock-profile``.
The samples are measured by ``services.worker.engines.profile``.

The fit (``fit_timing``) minimises *relative* error (weights 1/seconds), so short prompts are fitted as
well as long ones, and drops a term whose coefficient comes out negative (a non-negative fit, by hand).
Decode is fitted to ``base + per_seq * batch + per_kv_token * batch * mean_context`` (the mock's form),
with mean_context = prompt + half the decode tokens.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from common.timing import TimingModel

PROFILE_KIND = "splitserve.profile"
PROFILE_VERSION = 1


# ------------------------------------------------------------------------------------------- fitting


def _nonneg_weighted_lstsq(columns: list[np.ndarray], y: np.ndarray) -> list[float]:
    """Least squares of relative error (rows weighted 1/y); a negative coefficient's term is dropped."""
    active = list(range(len(columns)))
    weights = 1.0 / np.maximum(y, 1e-12)
    while True:
        a = np.stack([columns[i] for i in active], axis=1) * weights[:, None]
        sol, *_ = np.linalg.lstsq(a, y * weights, rcond=None)
        if (sol >= 0).all() or len(active) == 1:
            coeffs = [0.0] * len(columns)
            for i, c in zip(active, sol):
                coeffs[i] = max(float(c), 0.0)
            return coeffs
        del active[int(np.argmin(sol))]


def fit_timing(prefill: Sequence[Mapping[str, Any]], decode: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TimingModel fields fitted to profile samples (only the curves that have samples)."""
    fields: dict[str, Any] = {}
    if len(prefill) >= 1:
        n = np.array([float(p["num_tokens"]) for p in prefill])
        y = np.array([float(p["seconds"]) for p in prefill])
        cols = [np.ones_like(n), n, n * n][: max(1, min(3, len(prefill)))]
        coeffs = _nonneg_weighted_lstsq(cols, y)
        fields["prefill_coeffs_s"] = tuple(coeffs + [0.0] * (3 - len(coeffs)))
    if len(decode) >= 1:
        b = np.array([float(d["batch"]) for d in decode])
        kv = b * np.array([float(d["mean_context"]) for d in decode])
        y = np.array([float(d["step_s"]) for d in decode])
        cols = [np.ones_like(b), b, kv][: max(1, min(3, len(decode)))]
        base, per_seq, per_kv = (_nonneg_weighted_lstsq(cols, y) + [0.0, 0.0])[:3]
        fields.update(decode_base_s=base, decode_per_seq_s=per_seq, decode_per_kv_token_s=per_kv)
    return fields


def fit_errors(timing: TimingModel, prefill: Sequence[Mapping[str, Any]],
               decode: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Worst relative error of the fitted model against each curve's samples."""
    def worst(pairs: list[tuple[float, float]]) -> float:
        return max((abs(model - seen) / seen for model, seen in pairs), default=0.0)

    return {
        "prefill_max_rel_err": worst([(timing.prefill_s(p["num_tokens"]), p["seconds"]) for p in prefill]),
        "decode_max_rel_err": worst([(timing.decode_s(d["batch"], d["batch"] * d["mean_context"]), d["step_s"])
                                     for d in decode]),
    }


# ----------------------------------------------------------------------------------------- documents


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts: dict[str, Any] = {"hostname": platform.node(), "arch": platform.machine(), "cpu_model": cpu_model,
                             "nproc": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)),
                             "python": sys.version.split()[0], "loadavg": list(os.getloadavg())}
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE"):
        if key in os.environ:
            facts[key] = os.environ[key]
    facts["ld_preload_libgomp"] = "libgomp" in os.environ.get("LD_PRELOAD", "")
    return facts


def build_document(samples: Mapping[str, Any], conditions: Mapping[str, Any], spec: Any) -> dict[str, Any]:
    """The profile of measured ``samples`` (``spec``: the sweep that took them, a dataclass)."""
    timing_fields = fit_timing(samples["prefill"], samples["decode"])
    timing = TimingModel.from_profile(timing_fields)
    return {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        "conditions": {**conditions, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "machine": {**machine_facts(), "loadavg_before": samples.get("loadavg_before")},
                       "spec": asdict(spec),
                       "elapsed_s": round(samples["elapsed_s"], 3), "truncated": samples["truncated"]},
        "prefill": list(samples["prefill"]),
        "decode": list(samples["decode"]),
        "timing": {k: list(v) if isinstance(v, tuple) else v for k, v in timing_fields.items()},
        "fit": fit_errors(timing, samples["prefill"], samples["decode"]),
    }


def load_profile(path: Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a profile is a JSON object")
    return doc


def timing_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """TimingModel fields of a profile document; a flat dict of TimingModel fields passes through."""
    if doc.get("kind") == PROFILE_KIND:
        return dict(doc["timing"])
    return dict(doc)


# Tier speeds a profile may carry (measured e.g. by bench/tiers.py): the router's seed for its tier-speed
# learner (services/router/tier_credit.py TierConfig fields: bytes/s and seconds per load).
TIER_FIELDS = ("host_bytes_per_s", "disk_bytes_per_s", "host_latency_s", "disk_latency_s")


def tier_fields(doc: Mapping[str, Any]) -> dict[str, float]:
    """The profile's ``tiers`` figures that are present ({} for a profile without them)."""
    tiers = doc.get("tiers") or {}
    if not isinstance(tiers, Mapping):
        raise ValueError("a profile's tiers is a JSON object")
    return {k: float(tiers[k]) for k in TIER_FIELDS if tiers.get(k) is not None}


def load_timing(path: Path, speedup: float = 1.0) -> TimingModel:
    """The mock's timing from a profile file (``splitserve worker --mock-profile``)."""
    return TimingModel.from_profile({**timing_fields(load_profile(path)), "speedup": speedup})


def write_profile(doc: Mapping[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
