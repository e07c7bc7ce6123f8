"""Frontend under hostile load: do normal streams keep their latency, and does the frontend give memory back?

Starts ``splitserve up --engine mock --aggregated 1`` (router, one mock worker at the default timing of a ~100M
model on CPU, one frontend), pins the frontend alone on ``--frontend-core`` and everything else (router,
worker, launcher, this client, the hostile process) on ``--client-core``, then runs back-to-back phases while
``--streams`` normal streaming chat completions run closed-loop the whole time:

  warmup (unmeasured), baseline, hostile, baseline, hostile (A B A B), recovery.

A hostile phase adds, from a process of its own (bench/lib/hostile.py): 300 slowloris sockets (a header byte
every 2 s, never done), 10 clients each writing 30 MB of headers (again after 1 s), and one 7 MB chat prompt
a second. Reported per phase: the normal streams' TTFT and ITL (p50/p99, by send time), the frontend's CPU
and event-loop lag; over the run: the frontend's RSS (VmRSS) before/peak/after, what the hostile clients got
back, and the goals (bench/lib/hostile_eval.py): hostile TTFT p99 and ITL p99 within 1.2x of baseline; RSS
after recovery within 10% of before.

    python -m bench.frontend_hostile [--phase-s 30] [--streams 16] [--osl 64]

Writes bench/results/frontend_hostile.json (results + conditions) and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.frontend import chat_bodies, long_text
from bench.lib import hostile_eval as ev
from bench.lib.client import Client, StreamResult, get
from tests.harness.graph import REPO, start_graph
from bench.lib.hostile import HostileConfig
from bench.lib.load import check_tokens
from bench.lib.procs import pin, proc_cpu_s, rss_mib
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, finish, write_result
from bench.lib.server import parse_prometheus

CHAT = "/v1/chat/completions"
RSS_INTERVAL_S = 0.25


async def _scrape(url: str) -> dict[str, float]:
    status, body = await asyncio.get_running_loop().run_in_executor(None, get, url + "/metrics")
    return parse_prometheus(body.decode()) if status == 200 else {}


async def _hostile(cfg: HostileConfig, out: Path) -> asyncio.subprocess.Process:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in asdict(cfg).items()]
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.lib.hostile", *args, f"--out={out}",
                                                cwd=REPO)


async def drive(url: str, frontend_pid: int, phases: list[ev.Phase], bodies: list[dict], num_streams: int,
                osl: int, stagger_s: float, hostile_cfg: HostileConfig, tmp: Path) -> dict[str, Any]:
    """Runs the phases; returns raw observations (sent requests, RSS samples, per-phase CPU/lag/hostile)."""
    loop_end_s = phases[-1].end_s
    sent: list[tuple[float, StreamResult]] = []
    rss: list[tuple[float, float]] = []
    client = Client(url)
    counter = iter(range(10**9))

    async def stream_slot(index: int) -> None:
        # Staggered starts: streams started together stay in step, and every prompt then waits for all 16
        # prefills batched into one step (a 1 s TTFT that says nothing about the frontend).
        await asyncio.sleep(index * stagger_s)
        while time.perf_counter() < loop_end_s:
            i = next(counter)
            res = StreamResult()
            sent.append((time.perf_counter(), res))
            await client.stream(CHAT, bodies[i % len(bodies)], 120.0, res)
            check_tokens(res, osl)

    async def sample_rss() -> None:
        while time.perf_counter() < loop_end_s:
            rss.append((time.perf_counter(), rss_mib(frontend_pid)))
            await asyncio.sleep(RSS_INTERVAL_S)
        rss.append((time.perf_counter(), rss_mib(frontend_pid)))

    per_phase: dict[str, dict[str, Any]] = {}

    async def control() -> None:
        for phase in phases:
            await asyncio.sleep(max(0.0, phase.start_s - time.perf_counter()))
            cpu0, lag0 = proc_cpu_s(frontend_pid), await _scrape(url)
            proc, out = None, tmp / f"{phase.name}.json"
            if phase.kind == "hostile":
                cfg = HostileConfig(**{**asdict(hostile_cfg), "duration_s": phase.end_s - time.perf_counter()})
                proc = await _hostile(cfg, out)
            await asyncio.sleep(max(0.0, phase.end_s - time.perf_counter()))
            info: dict[str, Any] = {}
            if proc is not None:
                t = time.perf_counter()
                await proc.wait()
                info["hostile_exit_late_s"] = round(time.perf_counter() - t, 3)
                info["hostile"] = json.loads(out.read_text()) if out.exists() else None
            info["frontend_cpu_s"] = round(proc_cpu_s(frontend_pid) - cpu0, 3)
            info["loop_lag"] = ev.loop_lag_over(lag0, await _scrape(url))
            info["rss_end_mib"] = round(rss_mib(frontend_pid), 1)
            per_phase[phase.name] = info

    try:
        await asyncio.gather(control(), sample_rss(), *(stream_slot(i) for i in range(num_streams)))
    finally:
        await client.aclose()
    return {"sent": sent, "rss": rss, "per_phase": per_phase}


def hostile_summary(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "slowloris": {"opened": stats["slowloris_opened"], "closed_by_server": stats["slowloris_closed_by_server"],
                      "statuses": stats["slowloris_statuses"],
                      "open_s": ev.seconds_summary(stats["slowloris_open_s"])},
        "big_header": {"attempts": stats["big_header_attempts"], "statuses": stats["big_header_statuses"],
                       "bytes_written": ev.seconds_summary(stats["big_header_sent_bytes"]),
                       "answer_s": ev.seconds_summary(stats["big_header_answer_s"])},
        "big_prompt": {"sent": stats["big_prompt_sent"], "statuses": stats["big_prompt_statuses"],
                       "answer_s": ev.seconds_summary(stats["big_prompt_latency_s"])},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="warmup,baseline,hostile,baseline,hostile,recovery")
    ap.add_argument("--phase-s", type=float, default=30.0, help="seconds of each baseline and hostile phase")
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--recovery-s", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=16, help="normal streams, closed loop")
    ap.add_argument("--isl", type=int, default=128, help="target prompt tokens of a normal stream")
    ap.add_argument("--osl", type=int, default=64, help="output tokens of a normal stream (ignore_eos)")
    ap.add_argument("--stagger-s", type=float, default=0.15, help="stream i starts i times this late")
    ap.add_argument("--mock-speedup", type=float, default=1.0)
    ap.add_argument("--frontend-core", type=int, default=1)
    ap.add_argument("--client-core", type=int, default=0, help="this client, the hostile process, router, worker")
    ap.add_argument("--num-slowloris", type=int, default=300)
    ap.add_argument("--num-big-header", type=int, default=10)
    ap.add_argument("--prompt-bytes", type=int, default=7_000_000)
    ap.add_argument("--max-ratio", type=float, default=1.2)
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--out", type=Path, default=RESULTS / "frontend_hostile.json")
    args = ap.parse_args()

    from services.frontend.http_messages import HttpConfig
    from services.frontend.tokenizer import ModelTokenizer
    from services.worker.engines.mock.config import MockEngineConfig

    ensure_tiny_model(args.model)
    model_name = args.model.resolve().name
    tokenizer = ModelTokenizer(args.model)
    base = long_text(tokenizer, args.isl)
    bodies = chat_bodies(model_name, [f"Request {i}: {base}" for i in range(5000)], args.osl)
    hostile_cfg = HostileConfig(model=model_name, num_slowloris=args.num_slowloris,
                                num_big_header=args.num_big_header, prompt_bytes=args.prompt_bytes)
    cond = conditions(
        "frontend_hostile", model=model_name, isl_target_tokens=args.isl, osl=args.osl,
        concurrency=args.streams, stream_stagger_s=args.stagger_s,
        pd_split="aggregated: 1 mock worker (role both), no prefill pool",
        engine=f"mock, default timing (common/timing.py TimingModel) / speedup {args.mock_speedup}",
        mock_timing={**asdict(MockEngineConfig().timing), "speedup": args.mock_speedup},
        router_policy="kv", transfer_backend="none",
        request="POST /v1/chat/completions, stream=true, include_usage, ignore_eos; unique prefix per request",
        phases=args.phases, phase_s=args.phase_s, warmup_s=args.warmup_s, recovery_s=args.recovery_s,
        hostile=asdict(hostile_cfg) | {"duration_s": "each hostile phase"},
        frontend_http_limits=asdict(HttpConfig()) | {"source": "frontend defaults (up passes none)"},
        pinning={"frontend": [args.frontend_core], "client_hostile_router_worker_launcher": [args.client_core]},
        client="bench/lib/client.py (aiohttp) in this process; hostile clients in a child process (raw asyncio)",
        malloc_env={k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))},
        phase_assignment="a normal request belongs to the phase it was sent in",
        rss="VmRSS of the frontend process every 0.25 s; before = last sample of baseline-1, after = end of run")

    RESULTS.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {args.client_core})
    graph = start_graph(RESULTS, "--engine", "mock", "--mock-speedup", str(args.mock_speedup), "--aggregated", "1",
                        "--model", str(args.model), "--log-level", "warning", log_name="frontend-hostile-graph.log")
    try:
        pids = cond["pids"] = graph.pids()
        for name, pid in [*pids.items(), ("launcher", graph.proc.pid)]:
            pin(pid, {args.frontend_core} if name == "frontend" else {args.client_core})
        durations = {"warmup": args.warmup_s, "baseline": args.phase_s, "hostile": args.phase_s,
                     "recovery": args.recovery_s}
        phases = ev.phase_plan(args.phases.split(","), durations, time.perf_counter() + 1.0)
        import uvloop

        with tempfile.TemporaryDirectory() as tmp:
            hostile_cfg = HostileConfig(**{**asdict(hostile_cfg), "port": graph.port})
            raw = uvloop.run(drive(graph.url, pids["frontend"], phases, bodies, args.streams, args.osl,
                                   args.stagger_s, hostile_cfg, Path(tmp)))
        if not graph.alive():
            raise SystemExit(f"graph died; see {graph.log_path}")
    finally:
        graph.stop()
    finish(cond)

    grouped = ev.by_phase(phases, [(t, r.timing()) for t, r in raw["sent"]])
    per_phase = {p.name: {"kind": p.kind, **ev.latency_summary(grouped[p.name], p.end_s - p.start_s),
                          **{k: v for k, v in raw["per_phase"][p.name].items() if k != "hostile"},
                          "hostile": hostile_summary(raw["per_phase"][p.name].get("hostile"))} for p in phases}
    pooled = {kind: ev.pooled(phases, grouped, kind) for kind in ("baseline", "hostile")}
    rss = ev.rss_summary(phases, raw["rss"])
    goals = ev.evaluate(pooled["baseline"], pooled["hostile"], rss, args.max_ratio, args.rss_tolerance)
    doc = {"bench": "frontend_hostile", "conditions": cond, "phases": per_phase, "pooled": pooled,
           "rss_mib": rss._asdict(), "rss_samples": [(round(t - phases[0].start_s, 2), round(m, 1))
                                                     for t, m in raw["rss"]],
           "goals": {**goals._asdict(), "met": goals.met, "max_ratio": args.max_ratio,
                     "rss_tolerance": args.rss_tolerance}}
    write_result(args.out, doc)

    mach = cond["machine"]
    print(f"frontend hostile bench ({cond['timestamp']}, {mach['nproc']}x {mach['cpu_model']}, commit "
          f"{str(mach['git']['commit'])[:10]}{' +dirty' if mach['git']['dirty'] else ''})")
    for name, r in per_phase.items():
        print(f"  {name:11s} n={r['num_ok']:4d} err={r['num_errors']} TTFT p50/p99 {r['ttft_ms']['p50']}/"
              f"{r['ttft_ms']['p99']} ms  ITL p50/p99 {r['itl_ms']['p50']}/{r['itl_ms']['p99']} ms  "
              f"frontend CPU {r['frontend_cpu_s']} s  RSS {r['rss_end_mib']} MiB  lag>50ms "
              f"{r['loop_lag']['probes_over_s'].get('0.05')}")
        if r["hostile"]:
            h = r["hostile"]
            print(f"      slowloris {h['slowloris']['statuses']} open_s {h['slowloris']['open_s']}; big header "
                  f"{h['big_header']['statuses']}; 7MB prompt {h['big_prompt']['statuses']} "
                  f"answer_s {h['big_prompt']['answer_s']}")
    for kind, r in pooled.items():
        print(f"  {kind:9s} pooled: TTFT p99 {r['ttft_ms']['p99']} ms, ITL p99 {r['itl_ms']['p99']} ms")
    print(f"  RSS MiB {rss._asdict()}")
    print(f"  goals: {doc['goals']}")
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
