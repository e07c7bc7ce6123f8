"""Chaos across hosts [multihost]: steady load while random faults hit random services; nothing may be lost.

    python -m bench.chaos --duration-s 1200 --seed 1 --out bench/results/chaos.json [--engine vllm]

The graph (bench/chaos_graph.py) runs on four namespaced hosts. Phases:
  reference  every request body of the pool once, no faults: the output each must have (the mock engine, and
             greedy vLLM, are deterministic). It is also the warm-up: RSS is read after it.
  chaos      --concurrency streams (long prompts on shared prefixes, some short ones) for --duration-s, to both
             frontends in turn, while bench/chaos_checks.schedule faults one service every 10-30 s.
  settle     the load drains, then (up to --settle-s) until the router replicas agree and every block is free.
Invariants (bench/chaos_checks.py; docs/measuring.md#chaos): every request completes with its reference output
or ends with an error on a frontend that was down (killed, not yet answering again); after it, no worker holds a
block, every process never restarted is within 10% of its RSS after warm-up, the router replicas list the same
workers. All written to the JSON with the fault log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench.chaos_checks import (HOG_S, LINK_DOWN_S, RSS_DRIFT_MAX, STOP_S, Fault, Outcome, blocks_leaked,
                                replicas_agree, rss_drift, schedule, verdict)
from bench.chaos_graph import ChaosGraph, Svc
from bench.lib.client import Client
from bench.lib.procs import rss_mib

REPO = Path(__file__).resolve().parents[1]


def bodies(model: str, n: int, seed: int) -> list[dict]:
    """``n`` seeded greedy streaming completions: 3 in 4 a 1,024-token shared prefix (one of 4) plus a unique
    64-512-token tail, 1 in 4 a short unique prompt (the decode worker prefills it itself)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(16, 8000) for _ in range(1024)] for _ in range(4)]
    out = []
    for i in range(n):
        tail = [rng.randrange(16, 8000) for _ in range(rng.randrange(64, 512) if i % 4 else 24)]
        prompt = (prefixes[i % 4] + tail) if i % 4 else tail
        out.append({"model": model, "prompt": prompt, "max_tokens": rng.choice((16, 32, 64)), "temperature": 0.0,
                    "seed": i, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    return out


class Faults:
    """Applies the schedule on a thread of its own; logs what it did and when each frontend was down."""

    def __init__(self, graph: ChaosGraph, plan: list[Fault], t0: float) -> None:
        self.graph, self.plan, self.t0 = graph, plan, t0
        self.log: list[dict] = []
        self.frontend_down: dict[str, list[tuple[float, float]]] = {fe.name: [] for fe in graph.frontends}
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for fault in self.plan:
            time.sleep(max(0.0, self.t0 + fault.at_s - time.monotonic()))
            try:
                entry = {"at_s": round(time.monotonic() - self.t0, 2), "kind": fault.kind, "target": fault.target}
                entry.update(self.apply(fault))
                self.log.append(entry)
                print("fault", json.dumps(entry), flush=True)
            except Exception as exc:  # a harness failure is recorded, the run goes on
                self.errors.append(f"{fault}: {exc!r}")

    def apply(self, fault: Fault) -> dict:
        svc = self.graph.services[fault.target]
        assert svc.proc is not None
        if fault.kind == "kill9":
            before = router_instances(self.graph)
            t_kill = time.monotonic()
            with self.graph.lock:
                svc.proc.signal(signal.SIGKILL)
                self.graph.restart(svc)
            back_s = self._wait_back(svc, before, t_kill)
            if svc.kind == "frontend":
                self.frontend_down[svc.name].append((t_kill, time.monotonic()))
            return {"back_after_s": back_s}
        if fault.kind == "stop5":
            svc.proc.signal(signal.SIGSTOP)
            time.sleep(STOP_S)
            svc.proc.signal(signal.SIGCONT)
            # nsenter stops itself when its child stops, and nothing wakes it: continue it too, or it never
            # reaps the child and a later kill9 of this service waits for it forever (the 20-minute run's finding).
            svc.proc.popen.send_signal(signal.SIGCONT)
            return {}
        if fault.kind == "link3":
            svc.host.link_down()
            try:
                time.sleep(LINK_DOWN_S)
            finally:
                svc.host.link_up()
            return {"host": svc.host.name}
        hog = svc.host.spawn([sys.executable, "-c", "while True: pass"], core=svc.core)
        time.sleep(HOG_S)
        hog.signal(signal.SIGKILL)
        hog.wait(10)
        return {"core": svc.core}

    def _wait_back(self, svc: Svc, before: dict[str, dict[str, str]], t_kill: float,
                   timeout_s: float = 60.0) -> float | None:
        """Seconds from the kill until the restarted service serves again. A frontend: it answers /health. A worker:
        every router lists its new instance (not the old registration, which lingers until its heartbeat times out)
        and the frontends see the full graph. A router: it lists every worker again. A kvtier: the frontends see the
        full graph (a tier's own registration is not watched)."""
        while time.monotonic() - t_kill < timeout_s:
            if svc.kind == "frontend":
                up = bool(self.graph.health(svc))
            elif svc.kind == "worker":
                now = router_instances(self.graph)
                up = self.graph.ready() and all(
                    ws.get(svc.name, "") not in ("", before.get(r, {}).get(svc.name, "")) for r, ws in now.items())
            elif svc.kind == "router":
                up = len(router_instances(self.graph).get(svc.name, {})) == len(self.graph.workers) \
                    and self.graph.ready()
            else:
                up = self.graph.ready()
            if up:
                return round(time.monotonic() - t_kill, 2)
            time.sleep(0.2)
        return None


def _recovery(log: list[dict]) -> dict[str, dict[str, float]]:
    """Seconds from a kill -9 until the service served again, by kind of service."""
    by_kind: dict[str, list[float]] = {}
    for entry in log:
        if entry.get("back_after_s") is not None:
            by_kind.setdefault(entry["target"].rsplit("-", 1)[0], []).append(entry["back_after_s"])
    return {kind: _spread(values) for kind, values in sorted(by_kind.items())}


def router_instances(graph: ChaosGraph) -> dict[str, dict[str, str]]:
    """Each router replica's workers, worker_id -> instance_id ({} for a replica that does not answer)."""
    from tests.harness.graph import list_workers

    async def one(endpoint: str) -> dict[str, str]:
        try:
            return {w.worker_id: w.instance_id for w in (await list_workers(endpoint)).workers}
        except Exception:  # noqa: BLE001 (down or cut off: it lists nobody)
            return {}

    async def every() -> dict[str, dict[str, str]]:
        return {r.name: await one(r.endpoint) for r in graph.routers}

    return asyncio.run(every())


def _spread(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {}
    at = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 2)  # noqa: E731
    return {"p50": at(0.5), "p99": at(0.99), "max": round(values[-1], 2),
            "num_over_30s": sum(v > 30.0 for v in values)}


async def load(graph: ChaosGraph, pool: list[dict], concurrency: int, until_s: float | None, seed: int,
               timeout_s: float) -> list[tuple[int, Outcome]]:
    """Streams ``concurrency`` at a time, to the frontends in turn: random pool entries until ``until_s``
    (monotonic), or each pool entry once (``until_s`` None). Returns (pool index, outcome)."""
    clients = {fe.name: Client(fe.endpoint) for fe in graph.frontends}
    names = list(clients)
    rng = random.Random(seed)
    out: list[tuple[int, Outcome]] = []
    counter = iter(range(10**9))
    todo = iter(range(len(pool)))

    async def one_loop() -> None:
        while True:
            n = next(counter)
            if until_s is None:
                k = next(todo, None)
                if k is None:
                    return
            elif time.monotonic() >= until_s:
                return
            else:
                k = rng.randrange(len(pool))
            fe = names[n % len(names)]
            start = time.monotonic()
            res = await clients[fe].stream("/v1/completions", pool[k], timeout_s)
            end = time.monotonic()
            out.append((k, Outcome(n, fe, start, end, None if res.error or not res.ok else res.text, res.error,
                                   res.error.startswith("timeout"))))
            if res.error and until_s is not None:
                await asyncio.sleep(0.2)  # a refused connect retries no faster than this

    try:
        await asyncio.gather(*(one_loop() for _ in range(concurrency)))
    finally:
        for c in clients.values():
            await c.aclose()
    return out


async def worker_views(graph: ChaosGraph) -> tuple[dict[str, set[str]], dict[str, int], dict]:
    """Each router replica's workers (id:role), each worker's free blocks, and their load."""
    from common.protocol import GetStats, WorkerStats
    from common.transport import new_id
    from tests.harness.graph import ask, list_workers

    views: dict[str, set[str]] = {}
    endpoints: dict[str, str] = {}
    for r in graph.routers:
        try:
            ws = (await list_workers(r.endpoint)).workers
        except Exception as exc:  # noqa: BLE001 (a replica that does not answer is a finding)
            views[r.name] = {f"unreachable: {type(exc).__name__}"}
            continue
        views[r.name] = {f"{w.worker_id}:{w.role}" for w in ws}
        endpoints.update({w.worker_id: w.endpoint for w in ws})
    free, loads = {}, {}
    for wid, ep in endpoints.items():
        try:
            st = await ask(ep, GetStats(request_id=new_id("chaos")))
        except Exception:  # noqa: BLE001
            continue
        assert isinstance(st, WorkerStats)
        free[wid] = st.load.num_free_blocks
        loads[wid] = {"free": st.load.num_free_blocks, "total": st.load.num_total_blocks,
                      "running": st.load.num_running, "waiting": st.load.num_waiting}
    return views, free, loads


def rss_of(graph: ChaosGraph) -> dict[str, float]:
    out = {}
    for s in graph.services.values():
        try:
            out[s.name] = round(rss_mib(s.proc.pid), 1)
        except (OSError, AttributeError):
            pass
    return out


def settle(graph: ChaosGraph, settle_s: float) -> dict:
    """Poll until the replicas agree on the full worker set and every block is free (or ``settle_s``)."""
    t0 = time.monotonic()
    want = len(graph.workers)
    while True:
        views, free, loads = asyncio.run(worker_views(graph))
        leaked = blocks_leaked(free, graph.num_blocks)
        agree = replicas_agree(views) and all(len(v) == want for v in views.values())
        done = agree and not leaked and len(free) == want
        print(f"settle: agree={agree} leaked={leaked} workers={len(free)}", flush=True)
        if done or time.monotonic() - t0 > settle_s:
            return {"settled_after_s": round(time.monotonic() - t0, 1), "replicas_agree": agree,
                    "router_views": {k: sorted(v) for k, v in views.items()}, "blocks_leaked": leaked,
                    "num_blocks_leaked": sum(leaked.values()), "workers": loads}
        time.sleep(1.0)


def run(args: argparse.Namespace, result: dict) -> None:
    """Fills ``result`` as it goes, so a run that fails late still leaves what it measured."""
    from tests.harness.graph import tiny_model_dir
    from tests.harness.hosts import hosts

    model = args.model or tiny_model_dir()
    pool = bodies(model.resolve().name, args.pool, args.seed)
    with hosts(4) as hs:
        graph = ChaosGraph(hs, args.log_dir, model, args.engine, args.mock_speedup, args.num_blocks)
        try:
            start_s = graph.start(args.ready_timeout_s)
            print(f"graph up in {start_s:.1f}s; reference pass ...", flush=True)
            ref = asyncio.run(load(graph, pool, args.concurrency, None, args.seed, args.request_timeout_s))
            ref_errors = [o.error for _, o in ref if o.text is None]
            expected = {k: o.text for k, o in ref if o.text is not None}
            rss_start = rss_of(graph)
            targets = sorted(graph.services)
            plan = schedule(args.seed, args.duration_s, targets)
            t0 = time.monotonic()
            faults = Faults(graph, plan, t0)
            stop_supervising = threading.Event()
            supervisor = threading.Thread(target=graph.supervise, args=(stop_supervising, t0), daemon=True)
            supervisor.start()
            faults.thread.start()
            print(f"chaos: {len(plan)} faults over {args.duration_s}s ...", flush=True)
            outcomes = asyncio.run(load(graph, pool, args.concurrency, t0 + args.duration_s, args.seed + 1,
                                       args.request_timeout_s))
            print(f"load done: {len(outcomes)} requests; waiting for the last fault ...", flush=True)
            faults.thread.join(60)
            down = [w for ws in faults.frontend_down.values() for w in ws]
            verdicts = Counter()
            lost = []
            for k, o in outcomes:
                if k not in expected:
                    verdicts["no_reference"] += 1
                    continue
                v = verdict(o, expected[k], faults.frontend_down.get(o.frontend, []))
                verdicts[v] += 1
                if v not in ("ok", "clean_error"):
                    lost.append({"index": o.index, "frontend": o.frontend, "verdict": v, "error": o.error[:300],
                                 "start_s": round(o.start_s - t0, 2), "end_s": round(o.end_s - t0, 2)})
            try:
                after = settle(graph, args.settle_s)
            except Exception as exc:  # noqa: BLE001 (written down: the invariants below then fail)
                after = {"error": repr(exc), "replicas_agree": False, "num_blocks_leaked": -1}
            stop_supervising.set()
            supervisor.join(30)
            rss_end = rss_of(graph)
            print("settled; stopping the graph", flush=True)
            steady = [s.name for s in graph.services.values() if s.num_restarts == 0]
            drift = rss_drift({n: rss_start[n] for n in steady if n in rss_start}, rss_end)
            result.update({
                "graph_start_s": round(start_s, 1),
                "reference": {"requests": len(ref), "errors": ref_errors[:5], "num_errors": len(ref_errors)},
                "faults": {"planned": len(plan), "applied": len(faults.log),
                           "by_kind": dict(Counter(f["kind"] for f in faults.log)),
                           "by_target": dict(Counter(f["target"] for f in faults.log)),
                           "harness_errors": faults.errors, "log": faults.log,
                           "frontend_down_s": [round(hi - lo, 2) for lo, hi in down]},
                "requests": {"total": len(outcomes), "completed_equal": verdicts["ok"],
                             "clean_errors": verdicts["clean_error"],
                             "lost": len(outcomes) - verdicts["ok"] - verdicts["clean_error"],
                             "by_verdict": dict(verdicts), "lost_examples": lost[:20],
                             # How long faults held the requests that did complete (a lost one hit the timeout).
                             "seconds": _spread([o.end_s - o.start_s for _, o in outcomes if o.text is not None])},
                "after": after,
                "restarts": {s.name: s.num_restarts for s in graph.services.values() if s.num_restarts},
                # Exits nobody caused (a worker whose engine died): restarted as `up` would; each is a finding.
                "self_exits": graph.self_exits,
                "recovery_s": _recovery(faults.log),
                "rss": {"start_mib": rss_start, "end_mib": rss_end, "drift_never_restarted": drift,
                        "max_drift": max(drift.values(), default=0.0), "limit": RSS_DRIFT_MAX},
            })
            result["invariants"] = {
                "nothing_lost": result["requests"]["lost"] == 0 and not ref_errors,
                "no_blocks_leaked": after["num_blocks_leaked"] == 0,
                "rss_within_limit": all(abs(d) <= RSS_DRIFT_MAX for d in drift.values()),
                "replicas_agree": after["replicas_agree"],
            }
        finally:
            graph.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=1200.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--engine", choices=("mock", "vllm"), default="mock")
    ap.add_argument("--model", type=Path, default=None, help="default: the tiny model (mock); vLLM: tiny-100m")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pool", type=int, default=48, help="distinct request bodies")
    ap.add_argument("--mock-speedup", type=float, default=4.0)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--request-timeout-s", type=float, default=120.0, help="a request still open then is lost")
    ap.add_argument("--settle-s", type=float, default=60.0)
    ap.add_argument("--ready-timeout-s", type=float, default=120.0)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "chaos.json")
    args = ap.parse_args()
    if args.engine == "vllm" and args.model is None:
        args.model = REPO / "models" / "tiny-100m"
    from bench.lib.results import conditions

    began = time.monotonic()
    doc = {"conditions": conditions(
        "chaos", engine=args.engine, duration_s=args.duration_s, seed=args.seed,
        concurrency=args.concurrency, request_timeout_s=args.request_timeout_s, pool=args.pool, mock_speedup=args.mock_speedup, num_blocks=args.num_blocks,
        topology="4 namespaced hosts (tests/harness/hosts.py): A frontend x2 + router x2 (core 0); " + (
            "B prefill + kvtier (core 0); C prefill + decode + kvtier (core 1); D decode (core 1)"
            if args.engine == "mock" else "B prefill (core 0); D decode (core 1); no kvtier"),
        faults="every 10-30 s (seeded): kill9 (then restarted, same command), stop5 (SIGSTOP 5 s), link3 (the "
               "service's host's link down 3 s), hog (busy process on the service's core 5 s)",
        load="streamed /v1/completions, greedy + seed; 3/4 a 1,024-token shared prefix (4 prefixes) + 64-511 "
             "unique tokens, 1/4 24 tokens; max_tokens 16/32/64; both frontends in turn",
        shared_machine="2 cores shared by every service, the load and the fault injector")}
    try:
        run(args, doc)
    except Exception as exc:
        doc["run_error"] = repr(exc)
        raise
    finally:
        doc["conditions"]["elapsed_s"] = round(time.monotonic() - began, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(json.dumps({k: doc.get(k) for k in ("invariants", "requests", "after")}, indent=2)[:4000])
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
