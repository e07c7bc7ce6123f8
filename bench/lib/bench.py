"""`splitserve bench`: run a sweep against an OpenAI-compatible server and write JSON + plots.

``run_bench(BenchConfig(...))`` does the whole thing and returns the run document; the CLI (cli/bench.py) only
parses flags into a ``BenchConfig``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.lib import plots
from bench.lib.metrics import aggregate
from bench.lib.procs import self_cpu_s
from bench.lib.machine import machine
from bench.lib.report import SCHEMA, now_iso, validate
from bench.lib.runner import PointRun, Progress, RequestParams, dumps, request_rows, run_point
from bench.lib.server import Target, is_loopback, metric_deltas, scrape, server_facts, server_models
from bench.lib.workloads import WorkloadSpec, make_workload, poisson_arrivals, prefix_warmup


class BenchError(Exception):
    """A problem worth one line to the user (bad flag, unreachable server), not a traceback."""


@dataclass
class BenchConfig:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None
    endpoint: str = "completions"
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    concurrency: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    max_concurrency: int | None = None
    num_requests: int = 100
    max_duration_s: float = 300.0
    timeout_s: float = 300.0
    warmup: int = 0
    # shared-prefix: before each point, one request per prefix of that point (bench/lib/workloads.py prefix_warmup)
    warm_prefixes: bool = False
    slo: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    # Mixed into every token (not into arrival times). None: a fresh random salt per run, recorded in the JSON.
    prompt_salt: int | None = None
    output: Path | None = None
    label: str = ""
    conditions: dict[str, str] = field(default_factory=dict)
    allow_remote: bool = False
    progress: bool = True
    plots: bool = True
    api_key: str = ""
    ignore_eos: bool = True
    continuous_usage: bool = True
    temperature: float | None = 0.0
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


def _load_points(cfg: BenchConfig) -> list[dict[str, Any]]:
    """One {mode, concurrency, rate, max_concurrency} per sweep point."""
    if cfg.concurrency and cfg.rate:
        raise BenchError("give --concurrency (closed loop) or --rate (open loop), not both")
    if any(c < 1 for c in cfg.concurrency) or any(r <= 0 for r in cfg.rate):
        raise BenchError("concurrency must be >= 1 and rate > 0")
    if cfg.rate:
        unit = "sessions/s" if cfg.workload.kind == "multi-turn" else "requests/s"
        return [{"mode": "open", "concurrency": None, "rate": float(r), "max_concurrency": cfg.max_concurrency,
                 "arrivals": f"poisson, rate in {unit}"} for r in cfg.rate]
    if cfg.workload.kind == "trace" and not cfg.concurrency:
        return [{"mode": "open", "concurrency": None, "rate": None, "max_concurrency": cfg.max_concurrency,
                 "arrivals": "trace timestamps"}]
    return [{"mode": "closed", "concurrency": c, "rate": None, "max_concurrency": None,
             "arrivals": "closed loop" + (" (concurrent sessions)" if cfg.workload.kind == "multi-turn" else "")}
            for c in (cfg.concurrency or [1])]


def _transfer_backend(cfg: BenchConfig, facts: dict[str, Any]) -> str:
    user = cfg.conditions.get("transfer_backend") or cfg.conditions.get("transfer")
    if user:
        return user
    roles = facts.get("workers_by_role") or {}
    if roles and not roles.get("prefill"):
        return "none (no prefill workers)"
    return "unknown (not visible to the client; pass --conditions transfer_backend=...)"


def base_conditions(cfg: BenchConfig, target: Target, model: str, models: list[str],
                    facts: dict[str, Any]) -> dict[str, Any]:
    user = dict(cfg.conditions)
    host = machine()
    git = host.pop("git")  # schema v1 keeps the commit apart from the machine
    if cfg.label:
        user["label"] = cfg.label
    return {
        "target_url": target.url, "endpoint": cfg.endpoint, "model": model, "server_models": models,
        "workload": cfg.workload.describe(),
        "mode": "open" if cfg.rate or (cfg.workload.kind == "trace" and not cfg.concurrency) else "closed",
        "sweep": {"param": "rate" if cfg.rate else "concurrency", "values": cfg.rate or cfg.concurrency or [1]}
        if not (cfg.workload.kind == "trace" and not cfg.concurrency and not cfg.rate)
        else {"param": "trace", "values": [None]},
        "num_requests": cfg.num_requests, "max_duration_s": cfg.max_duration_s, "timeout_s": cfg.timeout_s,
        "warmup_requests": cfg.warmup,
        "warm_prefixes": cfg.warm_prefixes and "one request per shared prefix, one at a time, before each point",
        "seed": cfg.seed, "slo": cfg.slo, "user": user,
        "pd_split": user.get("pd") or user.get("pd_split") or facts.get("pd_split"),
        "block_size": int(user["block_size"]) if user.get("block_size", "").isdigit() else facts.get("block_size"),
        "transfer_backend": _transfer_backend(cfg, facts),
        "server": facts, "machine": host, "git": git, "timestamp": now_iso(),
        "client": {
            "tool": "splitserve bench (bench/lib/client.py: aiohttp keep-alive, SSE events timed as they arrive)",
            "argv": cfg.argv, "ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature,
            "continuous_usage_stats": cfg.continuous_usage,
            "prompt": "token-id list to /v1/completions (exact ISL)" if cfg.endpoint == "completions"
            else "text messages to /v1/chat/completions (one word per synthetic token; ISL approximate)",
            "tokens_per_chunk": "growth of usage.completion_tokens when sent per chunk, else 1 per text chunk; "
                                "tokens beyond that (final usage) count as arriving with the last chunk",
            "prompt_salt": cfg.prompt_salt,
            "prompts_salted": "tokens depend on (seed, prompt_salt, sweep point): no point, and no other run with "
                              "another salt, warms the server's prefix cache for this one; --prompt-salt repeats "
                              "a run's exact prompts",
            "stop_rule": "no request sent after max_duration_s; in-flight ones finish (bounded by timeout_s)",
        },
    }


def _arrivals(cfg: BenchConfig, load: dict[str, Any], sessions, salt: int) -> list[float] | None:
    if load["mode"] == "closed":
        return None
    if load["rate"] is None:
        return [s.at_s or 0.0 for s in sessions]
    return poisson_arrivals(len(sessions), load["rate"], cfg.seed, salt % 4096)


def _run(target: Target, sessions, params: RequestParams, load: dict[str, Any], arrivals, cfg: BenchConfig,
         label: str, num: int) -> PointRun:
    import uvloop

    prog = Progress(label, num, cfg.progress)
    return uvloop.run(run_point(target, sessions, params, concurrency=load["concurrency"], arrivals_s=arrivals,
                                max_concurrency=load.get("max_concurrency"), max_duration_s=cfg.max_duration_s,
                                timeout_s=cfg.timeout_s, progress=prog))


def point_line(doc: dict[str, Any]) -> str:
    r, load = doc["results"], doc["load"]
    what = f"c={load['concurrency']}" if load["mode"] == "closed" else (
        f"rate={load['rate']:g}/s" if load["rate"] is not None else "trace")
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    return (f"{what:>12s}  ok {r['num_ok']}/{r['num_requests']}  {r['requests_per_s']:.2f} req/s  "
            f"{r['output_tokens_per_s']:.1f} tok/s  TTFT p50 {f(r['ttft_ms']['p50'])} p99 {f(r['ttft_ms']['p99'])} ms  "
            f"ITL p50 {f(r['itl_ms']['p50'])} p99 {f(r['itl_ms']['p99'])} ms  TPOT p50 {f(r['tpot_ms']['p50'])} ms"
            + (f"  goodput {r['goodput_requests_per_s']:.2f}/s" if r["goodput_requests_per_s"] is not None else "")
            + (f"  cached {r['cached_token_share']:.1%}" if r["cached_token_share"] else ""))


def run_bench(cfg: BenchConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    try:
        target = Target.parse(cfg.url, cfg.api_key)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if not cfg.allow_remote and not is_loopback(target.host):
        raise BenchError(f"{target.host} is not a loopback address; pass --allow-remote to load a remote server")
    if cfg.endpoint not in ("completions", "chat"):
        raise BenchError("--endpoint must be completions or chat")
    if cfg.num_requests < 1:
        raise BenchError("--num-requests must be >= 1")
    if cfg.warm_prefixes and cfg.workload.kind != "shared-prefix":
        raise BenchError("--warm-prefixes needs --workload shared-prefix")
    loads = _load_points(cfg)
    if cfg.prompt_salt is None:
        cfg.prompt_salt = int.from_bytes(os.urandom(3), "little")
    if cfg.prompt_salt < 0:
        raise BenchError("--prompt-salt must be >= 0")
    models = server_models(target)
    if cfg.model:
        model = cfg.model
    elif models:
        model = models[0]
    else:
        raise BenchError(f"could not list models at {target.url}/v1/models (is the server up?); pass --model")
    facts = server_facts(target)
    conditions = base_conditions(cfg, target, model, models, facts)
    out_dir = cfg.output or Path("bench-results") / (conditions["timestamp"].replace(":", "").replace("+0000", "Z")
                                                     + (f"-{cfg.label}" if cfg.label else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    params = RequestParams(model=model, endpoint=cfg.endpoint, ignore_eos=cfg.ignore_eos,
                           continuous_usage=cfg.continuous_usage, temperature=cfg.temperature)
    echo(f"bench {target.url} model {model!r}, workload {cfg.workload.kind}, {len(loads)} point(s), "
         f"{cfg.num_requests} requests each; server: {facts.get('pd_split') or 'layout unknown'}, "
         f"engines {facts.get('engines')}, block size {conditions['block_size']} -> {out_dir}")
    points: list[dict[str, Any]] = []
    series = []
    for i, load in enumerate(loads):
        salt = cfg.prompt_salt * 4096 + i + 1
        try:
            sessions = make_workload(cfg.workload, cfg.num_requests, cfg.seed, salt)
        except (ValueError, OSError) as exc:
            raise BenchError(f"workload: {exc}") from None
        if not sessions:
            raise BenchError("the workload has no requests")
        num = sum(len(s.turns) for s in sessions)
        name = f"[{i + 1}/{len(loads)} " + (f"c={load['concurrency']}]" if load["mode"] == "closed" else
                                            (f"rate={load['rate']:g}]" if load["rate"] else "trace]"))
        if cfg.warmup:
            warm = make_workload(cfg.workload, cfg.warmup, cfg.seed, salt + 2048)
            wl = load if load["mode"] == "closed" else {**load, "mode": "closed", "concurrency": 1}
            _run(target, warm, params, {**wl, "concurrency": wl["concurrency"] or 1}, None, cfg,
                 name + " warmup", sum(len(s.turns) for s in warm))
        if cfg.warm_prefixes:
            warm = prefix_warmup(cfg.workload, cfg.seed, salt)
            run = _run(target, warm, params, {"concurrency": 1}, None, cfg, name + " warm prefixes", len(warm))
            failed = [s.result.error for s in run.sent if not s.result.ok]
            if failed or len(run.sent) < len(warm):
                raise BenchError(f"warming prefixes: {len(warm) - len(run.sent) + len(failed)} of {len(warm)} failed "
                                 f"({failed[0] if failed else 'not sent'})")
        arrivals = _arrivals(cfg, load, sessions, salt)
        before = scrape(target)
        load_before, cpu_before = os.getloadavg(), self_cpu_s()
        run = _run(target, sessions, params, load, arrivals, cfg, name, num)
        client_cpu_s = self_cpu_s() - cpu_before
        after = scrape(target)
        timings = [s.timing() for s in run.sent]
        results = aggregate(timings, run.duration_s, cfg.slo)
        results.update(wall_s=round(run.wall_s, 4), connections_opened=run.connections_opened,
                       stopped_by_max_duration=run.stopped_by_duration, num_planned=num,
                       client_cpu_s=round(client_cpu_s, 4),
                       loadavg_1m_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
        doc = {"schema": SCHEMA, "kind": "point", "index": i, "label": cfg.label, "timestamp": now_iso(),
               "conditions": conditions, "load": load, "results": results,
               "server_metrics": metric_deltas(before, after), "requests": request_rows(run)}
        (out_dir / f"point-{i}.json").write_bytes(dumps(doc))
        points.append(doc)
        series.append((name.strip("[]").split(" ", 1)[1], [t.ttft_s * 1e3 for t in timings if t.ok and t.ttft_s],
                       [g * 1e3 for t in timings if t.ok for g in t.itl_s()]))
        echo(point_line(doc))
    run_doc = {"schema": SCHEMA, "kind": "run", "label": cfg.label, "timestamp": conditions["timestamp"],
               "command": cfg.argv, "conditions": conditions, "sweep": conditions["sweep"],
               "points": [{k: v for k, v in p.items() if k not in ("requests", "schema", "kind")} for p in points],
               "files": {"points": [f"point-{i}.json" for i in range(len(points))]}}
    if cfg.plots:
        title = (f"{model} {cfg.workload.kind} {cfg.label} ({conditions['pd_split'] or '?'}, "
                 f"{conditions['machine']['nproc']} cpu)").replace("  ", " ")
        plots.sweep_plot(run_doc["points"], out_dir / "sweep.png", title)
        plots.latency_plot(series, out_dir / "latency.png", title)
        run_doc["files"]["plots"] = ["sweep.png", "latency.png"]
    problems = validate(run_doc)
    if problems:  # a bug in this tool, not in the server: say so loudly, still write what we have
        run_doc["schema_problems"] = problems
        echo(f"warning: result schema problems: {problems}")
    (out_dir / "run.json").write_bytes(dumps(run_doc))
    run_doc["output_dir"] = str(out_dir)
    echo(f"wrote {out_dir}/run.json" + (", sweep.png, latency.png" if cfg.plots else ""))
    return run_doc
