"""bench/planner: does the live planner keep SLOs while the workload shifts from prefill- to decode-heavy?

One open-loop (Poisson) request stream in phases (``--workload``):
  * ``shift``: one rate; short prompts and answers, then long prompts (prefill demand grows, "more requests"
    does not), then long prompts and long answers (decode demand grows);
  * ``phase-change``: prefill-heavy (ISL 2,048, OSL 32, 0.75 req/s), then decode-heavy (ISL 512, OSL 512,
    2 req/s): the pools must trade capacity.
Variants (arms), each on a fresh graph of mock workers whose timing is fitted from a real vLLM profile
(``--profile``, divided by ``--speedup``) and whose engines take the profile's start time (divided likewise)
to start, so a started worker costs what it costs there:
  * ``fixed``: 1P + 1D throughout (``--fixed P,D`` for others);
  * ``restart`` (alias ``planner``): ``up --planner`` from ``--start`` pools, scaling by starting and draining
    workers (the profile also drives the model-based targets);
  * ``switch``: the same with ``--role-switch``: it moves a worker between pools in place first and starts or
    drains workers only when no move serves.
Per phase: SLO attainment (TTFT <= ttft_ms and TPOT <= itl_ms per request), TTFT/TPOT percentiles. Per arm: the
pools over time (router, every second), worker-seconds (worker processes alive, starting and draining ones
included), the planner's actions (moves with their switch time, starts, drains) and its reaction to each
phase change (first move or start after it, in seconds and planner intervals).

    python -m bench.planner                      # shift: ~8 minutes; JSON in bench/results/planner.json
    python -m bench.planner --workload phase-change --variants fixed,restart,switch \
        --out bench/results/planner-roles.json   # ~8 minutes
    python -m bench.planner --engine vllm --workload phase-change --variants switch --phase-s 90 \
        --out /tmp/switch.json   # real vLLM engines (bench/lib/planner_vllm.py), ~6 minutes an arm
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

from bench.lib import planner_vllm
from tests.harness.graph import REPO, Graph, start_graph
from bench.lib.metrics import aggregate
from bench.lib.procs import children
from bench.lib.results import (
    RESULTS,
    conditions,
    ensure_tiny_model,
    finish,
    write_result,
)
from bench.lib.runner import RequestParams, run_point
from bench.lib.server import Target
from bench.lib.workloads import Session, poisson_prompts
from bench.planner_report import (
    WORKLOADS,
    planner_actions,
    reactions,
    slo_misses,
    worker_seconds,
)
from services.planner.predict import LiveConfig


def build_sessions(args: argparse.Namespace, seed: int) -> tuple[list[Session], list[float], list[str]]:
    """Every request of the run with its send time and phase; unique random prompts (no prefix hits)."""
    rng = random.Random(seed)
    sessions: list[Session] = []
    arrivals: list[float] = []
    phases: list[str] = []
    for index, (name, isl, osl, rate) in enumerate(args.phases):
        more, times = poisson_prompts(rng, isl, osl, rate or args.rate, index * args.phase_s,
                                      (index + 1) * args.phase_s)
        sessions += more
        arrivals += times
        phases += [name] * len(more)
    return sessions, arrivals, phases


async def sample_pools(graph: Graph, t0: float, out: list[dict[str, Any]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        # Worker processes the launcher runs (starting, serving, draining): what the pools cost.
        num_processes = sum("worker" in args for args in children(graph.proc.pid).values())
        try:
            listed = await graph.workers()
            draining = set(listed.draining)
            out.append({"t_s": round(time.perf_counter() - t0, 2),
                        "prefill": sum(w.role == "prefill" and w.worker_id not in draining for w in listed.workers),
                        "decode": sum(w.role == "decode" and w.worker_id not in draining for w in listed.workers),
                        "draining": len(draining), "num_processes": num_processes})
        except Exception as exc:  # a sample lost is a gap in the timeline, not a failed run
            out.append({"t_s": round(time.perf_counter() - t0, 2), "error": repr(exc),
                        "num_processes": num_processes})
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def run_variant(args: argparse.Namespace, variant: str, out_dir: Path) -> dict[str, Any]:
    decisions = out_dir / f"planner-decisions-{variant}.jsonl"
    decisions.unlink(missing_ok=True)
    num_prefill, num_decode = args.fixed if variant == "fixed" else args.start
    engine = (planner_vllm.engine_args(args) if args.engine == "vllm" else
              ["--engine", "mock", "--model", str(args.model), "--mock-profile", str(args.profile),
               "--mock-speedup", str(args.speedup), "--mock-start-s", str(args.mock_start_s)])
    up = [*engine, "--prefill", str(num_prefill), "--decode", str(num_decode), "--no-kvtier", "--block-size", "32",
          "--local-prefill-max-tokens", "256", "--log-level", "warning"]
    if variant != "fixed":
        up += ["--planner", "--planner-slo", f"ttft_ms={args.ttft_ms},itl_ms={args.itl_ms}",
               "--planner-interval-s", str(args.interval_s),
               "--planner-window-s", str(args.window_s), "--max-prefill", str(args.max_prefill),
               "--max-decode", str(args.max_decode), "--planner-decisions", str(decisions)]
        if not args.reactive_only:
            up += ["--planner-profile", str(args.scaled_profile)]
        if variant == "switch":
            up += ["--role-switch"]
    graph = start_graph(out_dir, *up, log_name=f"planner-graph-{variant}.log",
                        ready_timeout_s=(480.0 if args.engine == "vllm" else 240.0) + args.mock_start_s)
    start_s = graph.startup_s
    sessions, arrivals, phases = build_sessions(args, args.seed)
    timeline: list[dict[str, Any]] = []
    stop = asyncio.Event()
    try:
        t0, t0_wall = time.perf_counter(), time.time()
        sampler = asyncio.create_task(sample_pools(graph, t0, timeline, stop))
        run = await run_point(Target.parse(graph.url), sessions, RequestParams(model=args.model.name),
                              arrivals_s=arrivals, max_duration_s=len(args.phases) * args.phase_s + 60,
                              timeout_s=120)
        end_s = time.perf_counter() - t0
        stop.set()
        await sampler
    finally:
        leftover = graph.stop()
    slo = {"ttft_ms": args.ttft_ms, "tpot_ms": args.itl_ms}
    by_phase: dict[str, Any] = {}
    for name, isl, osl, rate in args.phases:
        sent = [s for s in run.sent if phases[s.session] == name]
        agg = aggregate([s.timing() for s in sent], args.phase_s, slo)
        by_phase[name] = {"isl": isl, "osl": osl, "rate_rps": rate or args.rate, **{k: agg[k] for k in (
            "num_requests", "num_ok", "num_errors", "slo_attainment", "ttft_ms", "tpot_ms", "output_tokens_per_s")},
            "misses": slo_misses(sent, slo)}
    overall = aggregate([s.timing() for s in run.sent], run.duration_s, slo)
    actions = planner_actions(decisions, t0_wall)
    return {"variant": variant, "start": f"{num_prefill}P + {num_decode}D", "graph_start_s": round(start_s, 1),
            "slo_attainment": overall["slo_attainment"], "num_requests": overall["num_requests"],
            "num_errors": overall["num_errors"], "phases": by_phase,
            "worker_seconds": worker_seconds(timeline, end_s), "load_s": round(end_s, 1),
            "reactions": reactions(actions, args.phases, args.phase_s, args.interval_s),
            # Under load only: while the graph starts, the planner sees pools still registering (``up`` drops those).
            "num_moves": sum(a["action"] == "move" and a["t_s"] >= 0 for a in actions),
            "num_starts": sum(a["action"] == "start" and a["t_s"] >= 0 for a in actions),
            "starts_serving": planner_vllm.start_to_serving(actions, timeline),
            "actions": actions, "pools": timeline, "leftover_pids": leftover}


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
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="shift")
    ap.add_argument("--rate", type=float, default=0.75, help="requests/s, in phases without a rate of their own")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--engine", choices=("mock", "vllm"), default="mock",
                    help="vllm: real engines (bench/lib/planner_vllm.py; phase-change workload only)")
    ap.add_argument("--ttft-ms", type=float, default=None, help="default: 4000 (vllm: sized from the profile)")
    ap.add_argument("--itl-ms", type=float, default=None,
                    help="per-request TPOT bound, and the planner's ITL SLO (default: shift 25, phase-change 35)")
    ap.add_argument("--interval-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--max-prefill", type=int, default=3)
    ap.add_argument("--max-decode", type=int, default=3)
    ap.add_argument("--reactive-only", action="store_true", help="planner without the profile's targets")
    ap.add_argument("--variants", default="restart,fixed", help="fixed | restart (planner) | switch, comma-separated")
    ap.add_argument("--start", default=None,
                    help="planner arms' first pools: PREFILL,DECODE (default: shift 1,1; phase-change 3,1, what its "
                    "first phase needs)")
    ap.add_argument("--fixed", default="1,1", help="the fixed arm's pools: PREFILL,DECODE")
    ap.add_argument("--mock-start-s", type=float, default=None,
                    help="mock engines' start time (default: the profile's engine_start_s / speedup)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "planner.json")
    planner_vllm.add_args(ap)
    args = ap.parse_args()
    args.ttft_ms_given, args.ttft_ms = args.ttft_ms is not None, args.ttft_ms or 4000.0
    args.phases = WORKLOADS[args.workload]
    phase_change = args.workload == "phase-change"
    args.start_given = tuple(int(n) for n in args.start.split(",")) if args.start else None
    args.start = tuple(int(n) for n in (args.start or ("3,1" if phase_change else "1,1")).split(","))
    args.fixed = tuple(int(n) for n in args.fixed.split(","))
    args.itl_ms_given, args.itl_ms = args.itl_ms, args.itl_ms or (35.0 if phase_change else 25.0)
    profile_doc = json.loads(args.profile.read_text())
    if args.mock_start_s is None:
        args.mock_start_s = round(profile_doc.get("conditions", {}).get("engine_start_s", 0.0) / args.speedup, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.engine == "vllm":
        if not phase_change:
            raise SystemExit("--engine vllm runs --workload phase-change")
        args.start = args.start_given
        sizing = planner_vllm.configure(args, REPO)
    else:
        ensure_tiny_model(args.model)
        args.scaled_profile = scaled_profile(args.profile, args.speedup,
                                             args.out.parent / "planner-profile-scaled.json")
    cond = conditions(
        "planner", engine=args.engine,
        timing_profile=str(args.profile.relative_to(REPO) if args.profile.is_relative_to(REPO) else args.profile),
        profile_conditions=profile_doc.get("conditions", {}), mock_engine_start_s=args.mock_start_s,
        speedup=args.speedup, workload=args.workload, arrivals="poisson", phase_s=args.phase_s,
        phases=[{"name": n, "isl": i, "osl": o, "rate_rps": r or args.rate} for n, i, o, r in args.phases],
        slo={"ttft_ms": args.ttft_ms, "tpot_ms": args.itl_ms, "planner_itl_p90_ms": args.itl_ms,
             "planner_ttft_p90_ms": args.ttft_ms},
        start={"fixed": f"{args.fixed[0]}P + {args.fixed[1]}D", "planners": f"{args.start[0]}P + {args.start[1]}D"},
        max_prefill=args.max_prefill, max_decode=args.max_decode, role_switch_min_dwell_s=30.0,
        # The switch arm's short/spare signals: latency predicted from live worker state (LiveConfig defaults).
        role_switch_live={"horizon_s": LiveConfig().horizon_s, "short_above_slo_share": LiveConfig().high_water,
                          "spare_below_slo_share_one_less": LiveConfig().low_water,
                          "spare_intervals": LiveConfig().spare_intervals,
                          # A move waiting only on that hysteresis is confirmed this much later (the 2nd reading).
                          "confirm_s": args.interval_s / 4},
        worker_seconds="worker processes alive (starting, serving, draining) x seconds, over the load",
        planner_interval_s=args.interval_s, planner_window_s=args.window_s, model_based=not args.reactive_only,
        block_size=32, kv_transfer="mock (simulated time)", kvtier=False, seed=args.seed)
    if args.engine == "vllm":
        cond.update(planner_vllm.conditions(args, sizing, REPO), speedup=1.0, mock_engine_start_s=None)
    runs = []
    for variant in ["restart" if v == "planner" else v for v in args.variants.split(",")]:
        print(f"[planner] {variant} ...", file=sys.stderr, flush=True)
        result = asyncio.run(run_variant(args, variant, args.out.parent))
        runs.append(result)
        print(f"[planner] {variant}: attainment {result['slo_attainment']} "
              + " ".join(f"{k}={v['slo_attainment']}" for k, v in result["phases"].items())
              + f" worker_s={result['worker_seconds']} moves={result['num_moves']} starts={result['num_starts']} "
              f"reactions={[(r['first_action'], r['after_s']) for r in result['reactions']]}", file=sys.stderr)
    finish(cond)
    write_result(args.out, {"bench": "planner", "conditions": cond, "runs": runs}, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
