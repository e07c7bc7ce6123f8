"""Offline simulation of bench/routing.py's aggregated mock graph, in virtual time: a quick way to fit router
defaults before measuring them for real (the result that counts is bench/routing.py's).

The parts are the real ones: each worker is the mock engine's Scheduler + BlockManager stepped by its
TimingModel (at ``speedup``), reporting its load like the engine does every ``heartbeat_s``; the router is the
real Policy over the real Registry (pending routes between reports), PrefixIndex (fed each step's KV events
after ``event_lag_s``) and the pending-hash overlay. Not simulated: CPU contention, sockets, the frontend
(``overhead_s`` per request stands for them).

    python -m bench.routing_sim --workers 6 --prefixes 12 --prefix-tokens 1500 --requests 720 \
        --concurrency 18 --block-size 64 --num-blocks 96 --speedup 8 --zipf 1.1
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.hashing import block_hashes
from common.protocol import WorkerInfo, WorkerLoad
from common.timing import TimingModel
from services.router.approx_index import ApproxIndex
from services.router.index import PrefixIndex
from services.router.policy import Candidate, Policy, PolicyConfig
from services.router.registry import Registry
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.scheduler import Scheduler, SchedulerConfig, SeqSpec
from services.worker.kv_events import to_wire

_MIN_RATE_TOKENS = 128  # as the mock engine: shorter prefills say nothing about the rate


@dataclass
class SimConfig:
    num_workers: int = 6
    num_prefixes: int = 12
    prefix_tokens: int = 1500
    suffix_tokens: int = 50
    output_tokens: int = 16
    num_requests: int = 720
    concurrency: int = 18
    zipf_s: float = 0.0
    block_size: int = 64
    num_blocks: int = 96
    speedup: float = 8.0
    heartbeat_s: float = 0.25
    event_lag_s: float = 0.01
    overhead_s: float = 0.004  # frontend + router + sockets, per request (before the worker sees it)
    # Worker CPU per sequence in a step (engine bookkeeping, one streamed token out): added to the step's
    # simulated time, as the real worker's step loop pays it on top of its sleep.
    cpu_per_seq_s: float = 0.0
    cpu_per_step_s: float = 0.0  # and per step (the loop, the sleep's wake-up on a busy machine)
    seed: int = 0


class _Worker:
    def __init__(self, worker_id: str, cfg: SimConfig, timing: TimingModel) -> None:
        self.worker_id = worker_id
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size)
        self.sched = Scheduler(SchedulerConfig(), self.blocks)
        self.timing = timing
        self.busy = False
        self.rate = 0.0

    def load(self) -> WorkerLoad:
        s = self.sched
        return WorkerLoad(num_running=s.num_running + s.num_loading, num_waiting=s.num_waiting,
                          num_free_blocks=self.blocks.num_free_blocks, num_total_blocks=self.blocks.num_blocks,
                          num_active_blocks=s.num_active_blocks(), num_waiting_tokens=s.num_queued_prefill_tokens(),
                          prefill_tokens_per_s=self.rate)

    def note_rate(self, num_tokens: int, step_s: float) -> None:
        if num_tokens >= _MIN_RATE_TOKENS and step_s > 0:
            rate = num_tokens / step_s
            self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate


@dataclass
class _Req:
    prompt: list[int]
    hashes: list[int]
    sent_s: float
    first_s: float = -1.0
    cached: int = 0
    worker_id: str = ""
    # The routed worker's load as the router saw it (last report + pending routes).
    seen: WorkerLoad | None = None
    true: WorkerLoad | None = None


@dataclass
class SimResult:
    reuse: float
    ttft_ms: dict[str, float]
    wall_s: float
    per_worker_requests: dict[str, int] = field(default_factory=dict)
    worst: list[dict[str, Any]] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def workload(cfg: SimConfig, vocab: int = 8192) -> list[list[int]]:
    """Same construction as bench/routing_workload.build (seeded token ids, zipf weights)."""
    rng = random.Random(cfg.seed)
    prefixes = [[rng.randrange(10, vocab) for _ in range(cfg.prefix_tokens)] for _ in range(cfg.num_prefixes)]
    weights = [1.0 / (k + 1) ** cfg.zipf_s for k in range(cfg.num_prefixes)] if cfg.zipf_s else None
    out = []
    for _ in range(cfg.num_requests):
        k = rng.choices(range(cfg.num_prefixes), weights)[0] if weights else rng.randrange(cfg.num_prefixes)
        out.append(prefixes[k] + [rng.randrange(10, vocab) for _ in range(cfg.suffix_tokens)])
    return out


def simulate(cfg: SimConfig, policy_config: PolicyConfig,
             prompts: list[list[int]] | None = None, decode_pending: bool = True) -> SimResult:
    prompts = prompts if prompts is not None else workload(cfg)
    timing = TimingModel(speedup=cfg.speedup)
    now = 0.0
    clock: Callable[[], float] = lambda: now
    workers = {f"w{i}": _Worker(f"w{i}", cfg, timing) for i in range(cfg.num_workers)}
    registry, index = Registry(), PrefixIndex()
    pending = ApproxIndex(ttl_s=3.0, clock=clock)
    for wid in workers:
        registry.register(WorkerInfo(worker_id=wid, role="both", model="m", block_size=cfg.block_size,
                                     num_blocks=cfg.num_blocks, endpoint="x", kv_events=True), 0.0)
    policy = Policy(policy_config)
    events: list[tuple[float, int, str, Any]] = []
    counter = itertools.count()

    def at(t: float, kind: str, data: Any) -> None:
        heapq.heappush(events, (t, next(counter), kind, data))

    reqs: dict[str, _Req] = {}
    todo = list(reversed(range(len(prompts))))
    routed_to: dict[str, int] = {w: 0 for w in workers}

    def issue(t: float) -> None:
        if todo:
            i = todo.pop()
            at(t, "route", i)

    for k, wid in enumerate(workers):
        at(cfg.heartbeat_s * (k + 1) / len(workers), "heartbeat", wid)
    for _ in range(cfg.concurrency):
        issue(0.0)

    def kick(w: _Worker) -> None:
        if w.busy or not w.sched.has_work():
            return
        plan = w.sched.schedule()
        step_s = timing.step_s(plan.num_prefill_tokens, len(plan.decode_seq_ids), plan.num_decode_kv_tokens)
        w.busy = True
        cpu_s = cfg.cpu_per_step_s + cfg.cpu_per_seq_s * (len(plan.prefills) + len(plan.decode_seq_ids))
        at(now + step_s + cpu_s, "step", (w.worker_id, plan, step_s))

    done = 0
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "route":
            i = data
            prompt = prompts[i]
            hashes = block_hashes(prompt, cfg.block_size, 0)
            cands = [Candidate(e.info.worker_id, registry.effective_load(e)) for e in registry.workers()]
            overlaps = index.overlaps(hashes)
            for wid, run in pending.overlaps(hashes).items():
                known = overlaps.get(wid)
                if known is None or known.device < run.device:
                    overlaps[wid] = run
            choice = policy.choose_route(hashes, len(prompt), cfg.block_size, cands, [], overlaps)
            wid = choice.decode_worker_id
            registry.note_routed(wid, max(len(prompt) - choice.num_cached_tokens_predicted, 0),
                                 len(prompt) if decode_pending else 0)
            pending.record(wid, hashes)
            routed_to[wid] += 1
            rid = f"r{i}"
            seen = next(c.load for c in cands if c.worker_id == wid)
            reqs[rid] = _Req(prompt, hashes, now - cfg.overhead_s / 2, worker_id=wid, seen=seen,
                             true=workers[wid].load())
            at(now + cfg.overhead_s / 2, "arrive", (wid, rid))
        elif kind == "arrive":
            wid, rid = data
            w = workers[wid]
            w.sched.add(SeqSpec(rid, tuple(reqs[rid].prompt), cfg.output_tokens))
            kick(w)
        elif kind == "step":
            wid, plan, step_s = data
            w = workers[wid]
            w.busy = False
            w.note_rate(plan.num_prefill_tokens, step_s)
            sampling = [c.seq_id for c in plan.prefills if c.samples] + list(plan.decode_seq_ids)
            for out in w.sched.update(plan, {sid: 11 for sid in sampling}):
                r = reqs[out.seq_id]
                if r.first_s < 0:
                    r.first_s = now
                    r.cached = out.num_cached_tokens
                if out.finish_reason is not None:
                    done += 1
                    issue(now + cfg.overhead_s)
            evs = w.blocks.drain_events()
            if evs:
                at(now + cfg.event_lag_s, "events", (wid, evs))
            kick(w)
        elif kind == "events":
            wid, evs = data
            for ev in evs:
                index.apply(wid, to_wire(ev))
        elif kind == "heartbeat":
            wid = data
            registry.report(wid, workers[wid].load(), now)
            if done < len(prompts):
                at(now + cfg.heartbeat_s, "heartbeat", wid)
    ttfts = [(r.first_s - r.sent_s) * 1000 for r in reqs.values()]
    reuse = sum(r.cached for r in reqs.values()) / sum(len(r.prompt) for r in reqs.values())
    return SimResult(round(reuse, 4), {"p50": round(_pct(ttfts, 0.5), 1), "p90": round(_pct(ttfts, 0.9), 1),
                                       "p99": round(_pct(ttfts, 0.99), 1)}, round(now, 2), routed_to,
                     [_trace(r) for r in sorted(reqs.values(), key=lambda r: r.sent_s - r.first_s)[:10]])


def _trace(r: _Req) -> dict[str, Any]:
    def brief(load: WorkerLoad | None) -> str:
        if load is None:
            return ""
        return (f"run {load.num_running} wait {load.num_waiting} qtok {load.num_waiting_tokens} "
                f"act {load.num_active_blocks} free {load.num_free_blocks} rate {load.prefill_tokens_per_s:.0f}")
    return {"ttft_ms": round((r.first_s - r.sent_s) * 1000, 1), "t": round(r.sent_s, 2), "w": r.worker_id,
            "cached": r.cached, "seen": brief(r.seen), "true": brief(r.true)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in vars(SimConfig()).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    ap.add_argument("--policies", default="kv,round-robin")
    ap.add_argument("--prefill-weight", type=float, default=None)
    ap.add_argument("--trace", action="store_true", help="print the 10 slowest requests")
    args = vars(ap.parse_args())
    policies = args.pop("policies").split(",")
    weight = args.pop("prefill_weight")
    args_trace = args.pop("trace")
    cfg = SimConfig(**args)
    prompts = workload(cfg)
    for name in policies:
        pc = PolicyConfig(policy=name) if weight is None else PolicyConfig(policy=name, prefill_weight=weight)
        res = simulate(cfg, pc, prompts)
        worst = vars(res).pop("worst")
        print(json.dumps({"policy": name, **vars(res)}))
        if args_trace:
            for row in worst:
                print("   ", json.dumps(row))


if __name__ == "__main__":
    main()
