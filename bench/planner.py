"""bench/planner: does the live planner keep SLOs while the workload shifts from prefill- to decode-heavy?

One open-loop (Poisson) request stream at a fixed rate, in three phases: short prompts and answers, then
long prompts (prefill demand grows, "more requests" does not), then long prompts and long answers (decode
demand grows). Variants, each on a fresh graph of mock workers whose timing is fitted from a real vLLM
profile (``--profile``, divided by ``--speedup``):
  * ``planner``: ``up --planner`` starting from 1P + 1D (the profile also drives the model-based targets);
  * ``fixed``: 1P + 1D throughout.
Per phase: SLO attainment (TTFT <= ttft_ms and TPOT <= itl_ms per request), TTFT/TPOT percentiles, and the
pools over time (sampled from the router every second) with the planner's scale events.

    python bench/planner.py                      # ~8 minutes; JSON in bench/results/planner.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.graph import REPO, Graph, start_graph
from bench.lib.metrics import aggregate
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, finish, write_result
from bench.lib.runner import RequestParams, run_point
from bench.lib.server import Target
from bench.lib.workloads import Session, poisson_prompts

PHASES = (("short", 512, 64), ("long_prompts", 2048, 64), ("long_answers", 2048, 512))


def build_sessions(args: argparse.Namespace, seed: int) -> tuple[list[Session], list[float], list[str]]:
    """Every request of the run with its send time and phase; unique random prompts (no prefix hits)."""
    rng = random.Random(seed)
    sessions: list[Session] = []
    arrivals: list[float] = []
    phases: list[str] = []
    for index, (name, isl, osl) in enumerate(PHASES):
        more, times = poisson_prompts(rng, isl, osl, args.rate, index * args.phase_s, (index + 1) * args.phase_s)
        sessions += more
        arrivals += times
        phases += [name] * len(more)
    return sessions, arrivals, phases


async def sample_pools(graph: Graph, t0: float, out: list[dict[str, Any]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            listed = await graph.workers()
            draining = set(listed.draining)
            out.append({"t_s": round(time.perf_counter() - t0, 2),
                        "prefill": sum(w.role == "prefill" and w.worker_id not in draining for w in listed.workers),
                        "decode": sum(w.role == "decode" and w.worker_id not in draining for w in listed.workers),
                        "draining": len(draining)})
        except Exception as exc:  # a sample lost is a gap in the timeline, not a failed run
            out.append({"t_s": round(time.perf_counter() - t0, 2), "error": repr(exc)})
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def run_variant(args: argparse.Namespace, variant: str, out_dir: Path) -> dict[str, Any]:
    decisions = out_dir / f"planner-decisions-{variant}.jsonl"
    decisions.unlink(missing_ok=True)
    up = ["--engine", "mock", "--model", str(args.model), "--prefill", "1", "--decode", "1", "--no-kvtier",
          "--mock-profile", str(args.profile), "--mock-speedup", str(args.speedup), "--block-size", "32",
          "--local-prefill-max-tokens", "256", "--log-level", "warning"]
    if variant == "planner":
        up += ["--planner", "--planner-slo", f"ttft_ms={args.ttft_ms},itl_ms={args.itl_ms}",
               "--planner-interval-s", str(args.interval_s),
               "--planner-window-s", str(args.window_s), "--max-prefill", str(args.max_prefill),
               "--max-decode", str(args.max_decode), "--planner-decisions", str(decisions)]
        if not args.reactive_only:
            up += ["--planner-profile", str(args.scaled_profile)]
    graph = start_graph(out_dir, *up, log_name=f"planner-graph-{variant}.log")
    start_s = graph.startup_s
    sessions, arrivals, phases = build_sessions(args, args.seed)
    timeline: list[dict[str, Any]] = []
    stop = asyncio.Event()
    try:
        t0, t0_wall = time.perf_counter(), time.time()
        sampler = asyncio.create_task(sample_pools(graph, t0, timeline, stop))
        run = await run_point(Target.parse(graph.url), sessions, RequestParams(model=args.model.name),
                              arrivals_s=arrivals, max_duration_s=len(PHASES) * args.phase_s + 60, timeout_s=120)
        stop.set()
        await sampler
    finally:
        leftover = graph.stop()
    slo = {"ttft_ms": args.ttft_ms, "tpot_ms": args.itl_ms}
    by_phase: dict[str, Any] = {}
    for name, isl, osl in PHASES:
        sent = [s for s in run.sent if phases[s.session] == name]
        agg = aggregate([s.timing() for s in sent], args.phase_s, slo)
        by_phase[name] = {"isl": isl, "osl": osl, **{k: agg[k] for k in (
            "num_requests", "num_ok", "num_errors", "slo_attainment", "ttft_ms", "tpot_ms", "output_tokens_per_s")}}
    overall = aggregate([s.timing() for s in run.sent], run.duration_s, slo)
    events = []
    if decisions.exists():
        for line in decisions.read_text().splitlines():
            rec = json.loads(line)
            for req in rec["requests"]:
                if req["target"] != req["current"]:
                    events.append({"t_s": round(rec["time_s"] - t0_wall, 1), **req})
    return {"variant": variant, "graph_start_s": round(start_s, 1), "slo_attainment": overall["slo_attainment"],
            "num_requests": overall["num_requests"], "num_errors": overall["num_errors"], "phases": by_phase,
            "pools": timeline, "scale_events": events, "leftover_pids": leftover}


def scaled_profile(profile: Path, speedup: float, out: Path) -> Path:
    """The profile with times divided by the mock's speedup: what the planner must plan for."""
    doc = json.loads(profile.read_text())
    t = doc["timing"]
    t["prefill_coeffs_s"] = [c / speedup for c in t["prefill_coeffs_s"]]
    for key in ("decode_base_s", "decode_per_seq_s", "decode_per_kv_token_s"):
        t[key] = t[key] / speedup
    out.write_text(json.dumps(doc))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, default=REPO / "bench/profiles/vllm-100m-cpu.json")
    ap.add_argument("--model", type=Path, default=REPO / "models/tiny", help="tokenizer/config only (mock engine)")
    ap.add_argument("--speedup", type=float, default=2.0, help="mock time = profile time / this")
    ap.add_argument("--rate", type=float, default=0.75, help="requests/s, the same in every phase")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--ttft-ms", type=float, default=4000.0)
    ap.add_argument("--itl-ms", type=float, default=25.0, help="per-request TPOT bound, and the planner's ITL SLO")
    ap.add_argument("--interval-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--max-prefill", type=int, default=3)
    ap.add_argument("--max-decode", type=int, default=3)
    ap.add_argument("--reactive-only", action="store_true", help="planner without the profile's targets")
    ap.add_argument("--variants", default="planner,fixed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "planner.json")
    args = ap.parse_args()
    ensure_tiny_model(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.scaled_profile = scaled_profile(args.profile, args.speedup, args.out.parent / "planner-profile-scaled.json")
    cond = conditions(
        "planner", engine="mock",
        timing_profile=str(args.profile.relative_to(REPO) if args.profile.is_relative_to(REPO) else args.profile),
        profile_conditions=json.loads(args.profile.read_text()).get("conditions", {}),
        speedup=args.speedup, rate_rps=args.rate, arrivals="poisson", phase_s=args.phase_s,
        phases=[{"name": n, "isl": i, "osl": o} for n, i, o in PHASES],
        slo={"ttft_ms": args.ttft_ms, "tpot_ms": args.itl_ms, "planner_itl_p90_ms": args.itl_ms,
             "planner_ttft_p90_ms": args.ttft_ms},
        start="1 prefill + 1 decode", max_prefill=args.max_prefill, max_decode=args.max_decode,
        planner_interval_s=args.interval_s, planner_window_s=args.window_s, model_based=not args.reactive_only,
        block_size=32, kv_transfer="mock (simulated time)", kvtier=False, seed=args.seed)
    runs = []
    for variant in args.variants.split(","):
        print(f"[planner] {variant} ...", file=sys.stderr, flush=True)
        result = asyncio.run(run_variant(args, variant, args.out.parent))
        runs.append(result)
        print(f"[planner] {variant}: attainment {result['slo_attainment']} "
              + " ".join(f"{k}={v['slo_attainment']}" for k, v in result["phases"].items()), file=sys.stderr)
    finish(cond)
    write_result(args.out, {"bench": "planner", "conditions": cond, "runs": runs}, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
