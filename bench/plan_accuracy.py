"""bench/plan_accuracy: the planner's predicted TTFT and ITL vs what a real vLLM 1P + 1D graph measures.

For each workload (fixed ISL/OSL, Poisson arrivals at a fixed rate) the plan (``services.planner.plan``, on
``--profile``, a `splitserve profile` of the same model on this machine) predicts mean TTFT (prefill + M/G/1
wait) and mean ITL (decode step at the steady batch) for the deployment it recommends; SLOs are set loose so
that it recommends the 1 prefill + 1 decode graph that runs here. Then the graph serves the workload and the
means are measured at the client. Error = (predicted - measured) / measured.

A profile times the bare engine. The serving stack adds per decode step and per remote prefill; a calibration
probe first (a third, light workload: ISL 512, OSL 128, 0.15 req/s, no queueing) measures those two overheads
(``services.planner.profile.with_serving_overheads``), and both workloads are predicted with the raw and with
the calibrated profile. The probe is not one of the workloads it is judged on.

    python -m bench.plan_accuracy                # ~6 minutes (100M model, bf16); JSON in bench/results/
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.harness.graph import REPO, Graph, start_graph
from bench.lib.metrics import aggregate
from bench.lib.results import MODEL_100M, RESULTS, conditions, finish, require_model, write_result
from bench.lib.runner import RequestParams, run_point
from bench.lib.server import Target
from bench.lib.workloads import Session, poisson_prompts
from common.timing import TimingModel
from common.profile import load_profile, timing_fields
from services.planner.plan import plan
from services.planner.profile import options_from_profile, with_serving_overheads
from services.planner.workload import Slo, Workload

WORKLOADS = (
    {"name": "prefill_heavy", "isl": 1024, "osl": 32, "rate_rps": 0.3},
    {"name": "decode_heavy", "isl": 256, "osl": 256, "rate_rps": 0.25},
)
PROBE = {"name": "calibration_probe", "isl": 512, "osl": 128, "rate_rps": 0.15}
LOOSE_SLO = Slo(ttft_ms=20_000, itl_ms=150)


def sessions_for(w: dict[str, Any], duration_s: float, seed: int) -> tuple[list[Session], list[float]]:
    return poisson_prompts(random.Random(seed), w["isl"], w["osl"], w["rate_rps"], 0.0, duration_s)


def mean_ms(values: list[float]) -> float | None:
    return sum(values) / len(values) * 1e3 if values else None


def err(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured, 4)


async def measure(graph: Graph, w: dict[str, Any], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    sessions, arrivals = sessions_for(w, args.duration_s, seed)
    run = await run_point(Target.parse(graph.url), sessions,
                          RequestParams(model=args.model.name), arrivals_s=arrivals,
                          max_duration_s=args.duration_s + 120, timeout_s=300)
    timings = [s.timing() for s in run.sent]
    ok = [t for t in timings if t.ok]
    # Requests sent in the first warmup_s are the queue filling from empty: not the steady state planned for.
    steady = [s.timing() for s in run.sent if s.start_s >= args.warmup_s and s.timing().ok]
    ttfts = [t.ttft_s for t in steady if t.ttft_s is not None]
    gaps = [g for t in steady for g in t.itl_s()]
    return {"num_requests": len(timings), "num_ok": len(ok), "num_steady": len(steady),
            "ttft_mean_ms": mean_ms(ttfts), "itl_mean_ms": mean_ms(gaps),
            "summary": aggregate(timings, run.duration_s)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile", type=Path, default=REPO / "bench/profiles/vllm-100m-cpu.json")
    ap.add_argument("--duration-s", type=float, default=120.0)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--calibrate-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "plan_accuracy.json")
    args = ap.parse_args()
    require_model(args.model)
    doc_profile = load_profile(args.profile)
    timing = TimingModel.from_profile(timing_fields(doc_profile))
    options = options_from_profile(doc_profile)
    cond = conditions(
        "plan_accuracy", engine="vllm", model=str(args.model.name), dtype=args.dtype, graph="1 prefill + 1 decode",
        kv_transfer="NIXL (UCX, kv_buffer_device cpu)", block_size=32, local_prefill_max_tokens=128,
        arrivals="poisson", duration_s_per_workload=args.duration_s, warmup_s=args.warmup_s,
        plan_slo=asdict(LOOSE_SLO), profile=str(args.profile), profile_fit=doc_profile.get("fit"),
        profile_conditions=doc_profile.get("conditions"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    graph = start_graph(args.out.parent, "--engine", "vllm", "--model", str(args.model), "--dtype", args.dtype,
                        "--prefill", "1", "--decode", "1", "--no-kvtier", "--local-prefill-max-tokens", "128",
                        "--log-level", "warning", ready_timeout_s=300.0, log_name="plan_accuracy-graph.log")
    cond["graph_start_s"] = round(graph.startup_s, 1)
    results = []

    def predict(t: TimingModel, w: dict[str, Any]) -> dict[str, Any]:
        d = plan(t, Workload.of(w["isl"], w["osl"], rate=w["rate_rps"]), LOOSE_SLO, options).disaggregated
        return {"num_prefill": d.prefill.workers if d.prefill else None,
                "num_decode": d.decode.workers if d.decode else None,
                "local_prefill_max_tokens": d.local_prefill_max_tokens, "ttft_ms": d.ttft_ms, "itl_ms": d.itl_ms,
                "decode_batch": d.decode.batch if d.decode else None,
                "prefill_utilization": d.prefill.utilization if d.prefill else None}

    try:
        probe = asyncio.run(measure(graph, PROBE, argparse.Namespace(**{**vars(args), "duration_s": args.calibrate_s}), args.seed + 100))
        raw_probe = predict(timing, PROBE)
        overheads = {"decode_step_overhead_s": (probe["itl_mean_ms"] - raw_probe["itl_ms"]) / 1e3,
                     "prefill_overhead_s": (probe["ttft_mean_ms"] - raw_probe["ttft_ms"]) / 1e3}
        calibrated = with_serving_overheads(timing, **overheads)
        print(f"[plan_accuracy] probe: measured TTFT {probe['ttft_mean_ms']:.0f} ms, ITL {probe['itl_mean_ms']:.1f} ms; "
              f"raw profile {raw_probe['ttft_ms']:.0f} / {raw_probe['itl_ms']:.1f}; overheads {overheads}",
              file=sys.stderr)
        for i, w in enumerate(WORKLOADS):
            raw, cal = predict(timing, w), predict(calibrated, w)
            measured = asyncio.run(measure(graph, w, args, args.seed + i))
            results.append({
                **w, "plan_raw_profile": raw, "plan_calibrated": cal, "measured": measured,
                "error_raw_profile": {"ttft": err(raw["ttft_ms"], measured["ttft_mean_ms"]),
                                      "itl": err(raw["itl_ms"], measured["itl_mean_ms"])},
                "error": {"ttft": err(cal["ttft_ms"], measured["ttft_mean_ms"]),
                          "itl": err(cal["itl_ms"], measured["itl_mean_ms"])},
            })
            print(f"[plan_accuracy] {w['name']}: measured TTFT {measured['ttft_mean_ms']:.0f} ms, ITL "
                  f"{measured['itl_mean_ms']:.1f} ms; calibrated plan {cal['ttft_ms']:.0f} / {cal['itl_ms']:.1f} "
                  f"(error {results[-1]['error']}); raw {raw['ttft_ms']:.0f} / {raw['itl_ms']:.1f} "
                  f"(error {results[-1]['error_raw_profile']})", file=sys.stderr)
    finally:
        leftover = graph.stop()
    cond["leftover_pids"] = leftover
    finish(cond)
    doc = {
        "bench": "plan_accuracy", "conditions": cond,
        "calibration": {"probe": PROBE, "probe_measured": probe, "probe_plan_raw_profile": raw_probe,
                        "overheads": overheads, "calibrate_s": args.calibrate_s},
        "workloads": results,
    }
    write_result(args.out, doc, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
