"""The serving layer alone against NVIDIA Dynamo (issue 29): `python -m bench.peers --suite serving-layer`.

Arms, interleaved A B A B (a fresh system each run):
  splitserve: `splitserve up --engine mock --mock-speedup inf --aggregated 2 --no-kvtier` (launcher, router,
              2 zero-delay mock workers, 1 frontend; KV-aware routing).
  splitserve-inproc: the same with `--router-in-frontend` (the router replica inside the frontend's process).
  dynamo:     ai-dynamo 1.6.1's `dynamo.frontend` + 2 `dynamo.mocker` (zero delay), file discovery, TCP request
              plane, no etcd/NATS (bench/peers_dynamo.py; its own venv).
  dynamo-batch: the same, every process under SCHED_BATCH (`chrt -b 0`), as `up` runs a mock graph's
              (cli/cpu_sched.py): what that policy alone is worth to Dynamo.
Both serve the embedded tiny model's tokenizer and get the same load from the same Python client
(bench/lib/load.py: aiohttp, keep-alive, SSE): --warmup unmeasured requests, then --requests streaming chat
completions, --concurrency at a time, max_tokens --max-tokens with ignore_eos, a unique one-line prompt each.
Per run: req/s, TTFT/ITL/E2E percentiles, CPU ms per request of every server process (utime+stime from
/proc/<pid>/stat before and after the measured load) and of the client.

    python -m bench.peers --suite serving-layer [--order splitserve-inproc,dynamo,splitserve-inproc,dynamo]
        [--requests 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.frontend import chat_bodies
from bench.frontend_cpu import cpu_snapshot, server_processes
from bench.lib.load import run_load_sync
from bench.lib.machine import loadavg
from bench.lib.procs import CLK_TCK
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, finish, write_result
from bench.peers_report import pyplot
from bench.peers_dynamo import DYNAMO_VERSION, SPEEDUP_RATIO, VENV, ensure_venv, start_dynamo
from tests.harness.graph import REPO, start_graph

CHAT = "/v1/chat/completions"
GOAL_RATIO = 1.5  # splitserve req/s over Dynamo's, each pair of one run
# splitserve's arms: `up`'s options beyond the common ones. "splitserve-inproc": each frontend hosts its router
# replica (`--router-in-frontend`): no router process, no route message, as Dynamo's frontend holds its router.
SPLITSERVE_ARMS: dict[str, tuple[str, ...]] = {"splitserve": (), "splitserve-inproc": ("--router-in-frontend",)}
DYNAMO_ARMS = ("dynamo", "dynamo-batch")


def _measure(url: str, pids: dict[str, int], bodies: list[dict], concurrency: int, max_tokens: int) -> dict:
    cpu0 = cpu_snapshot(pids)
    res = run_load_sync(url, CHAT, bodies, concurrency, expected_tokens=max_tokens)
    cpu1 = cpu_snapshot(pids)
    s = res.summary(expected_tokens=max_tokens)
    n = max(1, len(res.results))
    per = {k: round((cpu1[k] - cpu0[k]) * 1e3 / n, 4) for k in pids}
    keep = ("num_requests", "num_ok", "num_errors", "error_kinds", "requests_per_s", "output_tokens_per_s",
            "ttft_ms", "itl_ms", "e2e_ms", "wall_s", "connections_opened", "completion_tokens_seen",
            "client_cpu_ms_per_request")
    out = {k: s[k] for k in keep if k in s}
    out["cpu_ms_per_request"] = {"server_total": round(sum(per.values()), 4), "by_process": per}
    return out


def run_arm(args: argparse.Namespace, arm: str, index: int, bodies: list[dict], warm: list[dict]) -> dict:
    out: dict[str, Any] = {"arm": arm, "index": index, "loadavg_before": loadavg()}
    if arm in SPLITSERVE_ARMS:
        graph = start_graph(args.log_dir, "--engine", "mock", "--mock-speedup", "inf", "--aggregated",
                            str(args.workers), "--no-kvtier", "--model", str(args.model), "--log-level", "warning",
                            *SPLITSERVE_ARMS[arm], log_name=f"peers-serving-{index}-{arm}.log")
        url, stop, alive = graph.url, graph.stop, graph.alive
        pids = server_processes(graph.proc.pid)
        out.update(command=" ".join(graph.cmd[1:]), startup_s=round(graph.startup_s, 2))
    elif arm in DYNAMO_ARMS:
        dyn = start_dynamo(args.dynamo_python, args.model, args.workers, args.log_dir, str(index),
                           batch=arm == "dynamo-batch")
        url, stop, alive, pids = dyn.url, dyn.stop, dyn.alive, dyn.pids
        out.update(commands=dyn.commands, startup_s=dyn.startup_s, num_registered=dyn.num_registered)
    else:
        raise SystemExit(f"unknown arm {arm!r}: {', '.join([*SPLITSERVE_ARMS, *DYNAMO_ARMS])}")
    try:
        out["pids"] = pids
        if warm:
            run_load_sync(url, CHAT, warm, args.concurrency, expected_tokens=args.max_tokens)
        out.update(_measure(url, pids, bodies, args.concurrency, args.max_tokens))
        if not alive():
            out["error"] = "a server process exited during the run"
    finally:
        stop()
        out["loadavg_after"] = loadavg()
    return out


def summarize(runs: list[dict]) -> dict[str, Any]:
    """Means per arm, and each A B pair's ratio of splitserve's req/s over Dynamo's (in run order)."""
    arms: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if "requests_per_s" not in r:
            continue
        a = arms.setdefault(r["arm"], {"requests_per_s": [], "server_cpu_ms": [], "ttft_p50_ms": []})
        a["requests_per_s"].append(r["requests_per_s"])
        a["server_cpu_ms"].append(r["cpu_ms_per_request"]["server_total"])
        a["ttft_p50_ms"].append(r["ttft_ms"]["p50"])
    out: dict[str, Any] = {a: {**v, **{k + "_mean": round(statistics.fmean(x), 3) for k, x in v.items() if x}}
                           for a, v in arms.items()}
    dy = [r["requests_per_s"] for r in runs if r["arm"] == "dynamo" and "requests_per_s" in r]
    ratios: dict[str, list[float]] = {}
    for arm in dict.fromkeys(r["arm"] for r in runs if r["arm"] in SPLITSERVE_ARMS):
        ss = [r["requests_per_s"] for r in runs if r["arm"] == arm and "requests_per_s" in r]
        ratios[arm] = [round(s / d, 3) for s, d in zip(ss, dy) if d]
    out["ratio_per_pair"] = ratios  # per splitserve arm: its i-th run over Dynamo's i-th
    # The run as a whole (the goal: ">= 1.5x Dynamo's req/s in the same run"): mean over mean.
    out["ratio_of_means"] = {arm: round(statistics.fmean(out[arm]["requests_per_s"]) / statistics.fmean(dy), 3)
                             for arm in ratios if dy}
    out["goal"] = f"splitserve >= {GOAL_RATIO}x Dynamo's req/s in the run (ratio_of_means) and in every pair"
    out["goal_met_run"] = {arm: out["ratio_of_means"].get(arm, 0.0) >= GOAL_RATIO for arm in ratios}
    out["goal_met"] = {arm: bool(r) and min(r) >= GOAL_RATIO for arm, r in ratios.items()}
    dyb = [r["requests_per_s"] for r in runs if r["arm"] == "dynamo-batch" and "requests_per_s" in r]
    if dyb:  # against Dynamo given the same scheduling policy: not the goal's figure, what the policy is worth
        out["ratio_of_means_vs_dynamo_batch"] = {
            arm: round(statistics.fmean(out[arm]["requests_per_s"]) / statistics.fmean(dyb), 3) for arm in ratios}
    return out


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """Every run in run order, coloured by arm: its req/s, and its CPU ms a request (server, client on top). None
    without matplotlib."""
    runs = [r for r in doc["runs"] if "requests_per_s" in r]
    if (plt := pyplot()) is None:
        return None
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    color = {arm: f"C{i}" for i, arm in enumerate(arms)}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), dpi=90)
    xs = [r["index"] for r in runs]
    axes[0].bar(xs, [r["requests_per_s"] for r in runs], color=[color[r["arm"]] for r in runs])
    axes[0].set_ylabel("requests/s")
    server = [r["cpu_ms_per_request"]["server_total"] for r in runs]
    axes[1].bar(xs, server, color=[color[r["arm"]] for r in runs])
    axes[1].bar(xs, [r.get("client_cpu_ms_per_request", 0.0) for r in runs], bottom=server, color="lightgrey",
                label="client")
    axes[1].set_ylabel("CPU ms a request (server, client on top)")
    for ax in axes:
        ax.set_xlabel("run, in order")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=color[a]) for a in arms], labels=arms, fontsize=8)
    axes[1].legend(fontsize=8)
    cond = doc["conditions"]
    fig.suptitle(f"serving layer alone: {cond['workers']} zero-delay mocks, c={cond['concurrency']}, "
                 f"{cond['max_tokens']} tokens, {cond['num_requests']} requests a run ({cond['timestamp'][:10]})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.peers --suite serving-layer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--order", default="splitserve,dynamo,splitserve,dynamo")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--dynamo-venv", type=Path, default=VENV, help="made with ai-dynamo on first use")
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/peers"))
    ap.add_argument("--out", type=Path, default=RESULTS / "peers-serving-layer.json")
    args = ap.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    ensure_tiny_model(args.model)
    order = [a for a in args.order.split(",") if a]
    args.dynamo_python = ensure_venv(args.dynamo_venv) if set(order) & set(DYNAMO_ARMS) else None
    name = args.model.resolve().name
    texts = [f"Request {i}: tell me a short story about a fox." for i in range(args.requests)]
    bodies = chat_bodies(name, texts, args.max_tokens)
    warm = chat_bodies(name, [f"warmup {i}: tell me a short story about a fox." for i in range(args.warmup)],
                       args.max_tokens)
    cond = conditions(
        "peers-serving-layer", model=name, order=order, num_requests=args.requests, warmup_requests=args.warmup,
        concurrency=args.concurrency, max_tokens=args.max_tokens, workers=args.workers,
        request="POST /v1/chat/completions, stream=true, stream_options.include_usage=true, ignore_eos=true, "
                "a unique one-line user message each",
        client="bench/lib/load.py (aiohttp, keep-alive, SSE) in this process, one request in flight per slot",
        splitserve="`splitserve up --engine mock --mock-speedup inf --aggregated 2 --no-kvtier`: launcher, router "
                   "(KV-aware), 2 zero-delay mock workers, 1 frontend; `--cpu-sched auto`: all of a mock graph's "
                   "processes under SCHED_BATCH (cli/cpu_sched.py)",
        splitserve_inproc="the same with `--router-in-frontend`: no router process, the router replica (KV-aware) "
                          "inside the frontend's process, routes without a message",
        dynamo=f"ai-dynamo {DYNAMO_VERSION} (PyPI, own venv): dynamo.frontend (--router-mode round-robin) + 2 "
               f"dynamo.mocker (--speedup-ratio {SPEEDUP_RATIO}), --discovery-backend file, --request-plane tcp, "
               "--event-plane zmq; no etcd, no NATS",
        dynamo_batch="the same, each process started under `chrt -b 0` (SCHED_BATCH)",
        cores="server processes and the client unpinned, sharing every core of the machine",
        cpu_measure="utime+stime (all threads) from /proc/<pid>/stat of every server process, after minus before "
                    f"the measured load, over requests; clock tick {1000 // CLK_TCK} ms",
        note="2-core machine, every process on every core; loadavg_before/after of each run tell what else ran: "
             "compare arms within a pair of this run")
    doc: dict[str, Any] = {"conditions": cond, "runs": []}
    began = time.monotonic()
    for i, arm in enumerate(order):
        print(f"[{i}] {arm} ...", flush=True)
        try:
            run = run_arm(args, arm, i, bodies, warm)
        except Exception as exc:  # keep what finished
            run = {"arm": arm, "index": i, "error": repr(exc)}
        doc["runs"].append(run)
        if "requests_per_s" in run:
            print(f"  {run['requests_per_s']} req/s, ok {run['num_ok']}/{run['num_requests']}, TTFT p50 "
                  f"{run['ttft_ms']['p50']} ms, ITL p50 {run['itl_ms']['p50']} ms, server CPU "
                  f"{run['cpu_ms_per_request']['server_total']} ms/request {run['cpu_ms_per_request']['by_process']}",
                  flush=True)
        else:
            print(f"  failed: {run.get('error')}", flush=True)
        write_result(args.out, doc)
    doc["summary"] = summarize(doc["runs"])
    doc["plot"] = plot(doc, args.out.with_suffix(".png"))
    finish(cond)
    cond["elapsed_s"] = round(time.monotonic() - began, 1)
    write_result(args.out, doc)
    print(f"ratios {doc['summary']['ratio_per_pair']}, over the run {doc['summary']['ratio_of_means']} "
          f"(goal >= {GOAL_RATIO}); wrote {args.out}")
