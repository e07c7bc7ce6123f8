"""bench/planner's numbers from what a run left: worker-seconds, the planner's actions, its reaction times.

Pure functions on the run's samples and the planner's decisions file (JSON lines), table-tested in
tests/bench/test_planner_report.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.lib.metrics import request_values_ms


class Phase(NamedTuple):
    name: str
    isl: int
    osl: int
    rate_rps: float | None  # None: the run's --rate


# The original workload: the same rate throughout, prompts grow, then answers.
SHIFT = (Phase("short", 512, 64, None), Phase("long_prompts", 2048, 64, None), Phase("long_answers", 2048, 512, None))
# Prefill-heavy, then decode-heavy (timed from bench/profiles/vllm-100m-cpu.json / 2; for TTFT 4 s and ITL 35 ms
# the first needs ~3 prefill workers and one decode worker, the second one prefill worker and two decode workers
# (one alone saturates): the pools must trade a worker.
PHASE_CHANGE = (Phase("prefill_heavy", 2048, 32, 0.75), Phase("decode_heavy", 512, 512, 2.0))
WORKLOADS = {"shift": SHIFT, "phase-change": PHASE_CHANGE}


def worker_seconds(samples: Sequence[dict[str, Any]], end_s: float) -> float:
    """Integral of the worker processes alive (starting, serving or draining) over [0, end_s], from samples
    ``{"t_s", "num_processes"}`` taken about every second (each holds until the next)."""
    rows = sorted((s["t_s"], s["num_processes"]) for s in samples if "num_processes" in s and s["t_s"] <= end_s)
    total = 0.0
    for (t0, n), (t1, _) in zip(rows, [*rows[1:], (end_s, 0)]):
        total += n * (t1 - t0)
    return round(total, 1)


def planner_actions(decisions: Path, t0_wall: float) -> list[dict[str, Any]]:
    """What the planner did, in run time: moves the router confirmed, refused moves, and scale requests that
    change a pool (starts and drains; a move's own size change is not a scale)."""
    if not decisions.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in decisions.read_text().splitlines():
        rec = json.loads(line)
        t_s = round(rec["time_s"] - t0_wall, 1)
        move = rec.get("move")
        if move is not None and "role_set" in rec:
            out.append({"t_s": t_s, "action": "move", "worker_id": move["worker_id"], "to": move["to_role"],
                        "reasons": move["reasons"], "switch_s": round(rec["role_set"]["seconds"], 3)})
            continue
        if move is not None:
            out.append({"t_s": t_s, "action": "move_refused", "worker_id": move["worker_id"],
                        "why": rec.get("move_refused", "")})
        for req in rec["requests"]:
            if req["target"] != req["current"] and req["reason"] not in ("pending",):
                out.append({"t_s": t_s, "action": "start" if req["target"] > req["current"] else "drain",
                            "pool": req["pool"], "current": req["current"], "target": req["target"],
                            "reasons": req["reason"]})
    return out


def _toward(action: dict[str, Any]) -> str | None:
    """The pool an action adds capacity to (None for a drain or a refusal)."""
    if action["action"] == "move":
        return action["to"]
    if action["action"] == "start":
        return action["pool"]
    return None


def reactions(actions: Sequence[dict[str, Any]], phases: Sequence[Phase], phase_s: float,
              interval_s: float) -> list[dict[str, Any]]:
    """For each phase change: the first action after it (a move or a start), which pool it fed, and how long
    after the change, in seconds and in planner intervals (None: no action in that phase)."""
    out = []
    for index in range(1, len(phases)):
        start_s, end_s = index * phase_s, (index + 1) * phase_s
        first = next((a for a in sorted(actions, key=lambda a: a["t_s"])
                      if start_s <= a["t_s"] < end_s and _toward(a) is not None), None)
        out.append({"phase": phases[index].name, "at_s": start_s,
                    "first_action": None if first is None else first["action"],
                    "toward": None if first is None else _toward(first),
                    "after_s": None if first is None else round(first["t_s"] - start_s, 1),
                    "after_intervals": None if first is None else round((first["t_s"] - start_s) / interval_s, 1)})
    return out


def slo_misses(sent: list[Any], slo: dict[str, float]) -> dict[str, Any]:
    """Where a phase's SLO misses come from: how many requests missed TTFT, TPOT or both, and for the TPOT
    misses their largest gap between two tokens (one stall, e.g. the hand-off to decode, vs steps uniformly
    slow) and when they were sent (s into the run)."""
    out: dict[str, Any] = {"ttft": 0, "tpot": 0, "both": 0, "failed": 0, "tpot_miss_max_gap_ms": [],
                           "tpot_miss_sent_s": []}
    for s in sent:
        timing = s.timing()
        if not timing.ok:
            out["failed"] += 1
            continue
        values = request_values_ms(timing)
        ttft_miss = (values.get("ttft_ms") or 0.0) > slo["ttft_ms"]
        tpot_miss = (values.get("tpot_ms") or 0.0) > slo["tpot_ms"]
        if ttft_miss and tpot_miss:
            out["both"] += 1
        elif ttft_miss:
            out["ttft"] += 1
        elif tpot_miss:
            out["tpot"] += 1
        if tpot_miss:
            out["tpot_miss_max_gap_ms"].append(round(max(timing.itl_s(), default=0.0) * 1e3, 1))
            out["tpot_miss_sent_s"].append(round(s.start_s, 1))
    return out
