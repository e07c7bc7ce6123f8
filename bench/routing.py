"""KV-aware routing benchmark: prefix reuse, TTFT and throughput of kv vs round-robin vs random routing.

For each workload and each policy it starts a fresh graph (``splitserve up --engine mock --aggregated 4
--router-policy P``; the restart makes every policy start with cold caches), drives streaming
``/v1/completions`` with token-id prompts (exact lengths, no tokenizer in the way) through the raw keep-alive
client of bench/loadgen.py, reads ``usage.prompt_tokens_details.cached_tokens`` of every answer, scrapes the
router's Prometheus metrics and stops the graph. Policies are interleaved (A B C A B C ...) over repeats.

Workloads (defaults; every size is a flag):

  shared     8 prefixes of 2,000 tokens, each request = a uniformly drawn prefix + a unique 50-token suffix,
             800 requests at concurrency 16, 16 output tokens (ignore_eos).
  zipf       the same with prefix popularity ~ 1/rank**1.1 (zipf s=1.1 over the 8 prefixes).
  multiturn  32 sessions x 4 turns at concurrency 16 (16 sessions in flight, each one turn at a time):
             session i opens with prefix i % 8 + 50 user tokens; each later turn's prompt is the previous
             prompt + the 16 answer tokens + 50 new user tokens. The answer's token ids are the mock
             engine's (a pure function of the sequence, recomputed here), so turns can reuse the answer.
  vllm       2 real vLLM workers (tiny model, fp32, prefix caching on; they publish KV events, so routing is
             exact): 4 prefixes of 1,000 tokens, 120 requests at concurrency 4, kv vs round-robin.

KV room per mock worker: ``--num-blocks`` defaults to what holds ``--prefixes-per-worker`` (4) prefixes plus
every in-flight request's private blocks (see ``mock_num_blocks``), so 4 workers x 4 cannot hold all 8
prefixes everywhere: a policy that spreads each prefix over every worker thrashes, one that keeps each prefix
on 1-2 workers does not.

Reuse = sum(cached_tokens) / sum(prompt_tokens) over all answers. Its ceiling (``reuse_max``) is what an
infinite single cache would reuse on the same request stream (each prefix's first request is cold, every
suffix is new); ``reuse_of_max`` = reuse / reuse_max.

    python bench/routing.py                              # shared, zipf, multiturn; kv, round-robin, random
    python bench/routing.py --workloads shared --repeats 2
    python bench/routing.py --workloads vllm

Writes (merges per workload into) bench/results/routing.json and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from bench.loadgen import Record, _Conn, chat_request  # noqa: E402
from cli.launcher import free_port  # noqa: E402
from common.hashing import block_hashes  # noqa: E402
from tests.graph import Graph, tiny_model_dir, worker_stats  # noqa: E402

RESULTS = REPO / "bench" / "results"
GOALS = {"reuse_min": 0.95, "ttft_p50_speedup_vs_round_robin_min": 1.5}
DYNAMO_REFERENCE = {
    "version": "1.6.1", "workload": "shared (8 x 2,000-token prefixes, 4 mock workers, concurrency 16)",
    "reuse_kv": [0.91, 0.92], "reuse_round_robin": 0.58, "ttft_p50_ms_kv": 80, "ttft_p50_ms_round_robin": [92, 116],
}
_CACHED = re.compile(rb'"cached_tokens":\s*(\d+)')
_TOKEN_LOW = 10  # prompt token ids are drawn from [_TOKEN_LOW, vocab): clear of the special tokens


# ------------------------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    name: str
    engine: str = "mock"
    num_workers: int = 4
    num_prefixes: int = 8
    prefix_tokens: int = 2000
    suffix_tokens: int = 50
    output_tokens: int = 16
    num_requests: int = 800
    concurrency: int = 16
    zipf_s: float = 0.0  # 0: uniform prefix popularity
    num_sessions: int = 0  # > 0: multi-turn
    num_turns: int = 1
    policies: tuple[str, ...] = ("kv", "round-robin", "random")
    seed: int = 0
    # Filled by build():
    prompts: list[list[int]] = field(default_factory=list)  # single-turn requests
    sessions: list[list[list[int]]] = field(default_factory=list)  # per session, per turn: new user tokens
    prefix_of: list[int] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine, "workers": f"{self.num_workers} aggregated (role both)",
            "prefixes": self.num_prefixes, "prefix_tokens": self.prefix_tokens,
            "suffix_tokens": self.suffix_tokens, "output_tokens": self.output_tokens,
            "prefix_popularity": f"zipf s={self.zipf_s}" if self.zipf_s else "uniform",
            "concurrency": self.concurrency, "seed": self.seed,
        }
        if self.num_sessions:
            out.update(sessions=self.num_sessions, turns=self.num_turns,
                       num_requests=self.num_sessions * self.num_turns,
                       turn_prompt="previous prompt + 16 answer tokens + suffix_tokens new user tokens")
        else:
            out["num_requests"] = self.num_requests
            lengths = sorted(len(p) for p in self.prompts)
            out["isl"] = f"{lengths[0]}-{lengths[-1]} tokens (prefix + unique suffix)" if lengths else None
        out["osl"] = f"{self.output_tokens} (ignore_eos)"
        return out


def build(w: Workload, vocab_size: int) -> Workload:
    rng = random.Random(w.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(_TOKEN_LOW, vocab_size) for _ in range(n)]

    prefixes = [tokens(w.prefix_tokens) for _ in range(w.num_prefixes)]
    weights = [1.0 / (k + 1) ** w.zipf_s for k in range(w.num_prefixes)] if w.zipf_s else None
    if w.num_sessions:
        for i in range(w.num_sessions):
            w.prefix_of.append(i % w.num_prefixes)
            first = prefixes[i % w.num_prefixes] + tokens(w.suffix_tokens)
            w.sessions.append([first] + [tokens(w.suffix_tokens) for _ in range(w.num_turns - 1)])
    else:
        for _ in range(w.num_requests):
            k = rng.choices(range(w.num_prefixes), weights)[0] if weights else rng.randrange(w.num_prefixes)
            w.prefix_of.append(k)
            w.prompts.append(prefixes[k] + tokens(w.suffix_tokens))
    return w


class AnswerTokens:
    """The mock engine's output token ids for a prompt (pure function of the sequence and the seed)."""

    def __init__(self, model_dir: Path) -> None:
        from common.tiny_model import validate_model_dir
        from services.worker.engines.mock.config import MockEngineConfig
        from services.worker.engines.mock.tokens import next_token_id

        info = validate_model_dir(model_dir)
        self._config = MockEngineConfig(vocab_size=info.vocab_size,
                                        eos_token_id=info.eos_token_ids[0] if info.eos_token_ids else 0)
        self._next = next_token_id

    def __call__(self, prompt: list[int], num_tokens: int) -> list[int]:
        seq = list(prompt)
        for _ in range(num_tokens):
            seq.append(self._next(seq, None, self._config))
        return seq[len(prompt):]


def reuse_ceiling(requests: list[tuple[list[int], list[int]]], block_size: int) -> float:
    """Reuse of one infinite cache fed the (prompt, answer) stream in order: whole blocks of the prompt
    (minus its last token, which is always computed) already seen in an earlier prompt or answer."""
    seen: set[int] = set()
    cached = total = 0
    for prompt, answer in requests:
        hashes = block_hashes(prompt[:-1], block_size, 0)
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        cached += hit * block_size
        total += len(prompt)
        seen.update(block_hashes(prompt + answer[:-1], block_size, 0))
    return cached / total if total else 0.0


# ---------------------------------------------------------------------------------------------- client


class _UsageConn(_Conn):
    """loadgen's keep-alive connection that also keeps the raw SSE bytes, to read cached_tokens."""

    __slots__ = ("raw",)

    def __init__(self) -> None:
        super().__init__()
        self.raw = bytearray()

    def send(self, request: bytes) -> asyncio.Future[Record]:
        self.raw.clear()
        return super().send(request)

    def _on_payload(self, payload: bytearray) -> None:
        self.raw += payload
        super()._on_payload(payload)

    def cached_tokens(self) -> int:
        found = _CACHED.findall(self.raw)
        return int(found[-1]) if found else -1


@dataclass
class Answer:
    rec: Record
    cached_tokens: int
    sent_s: float  # since the load started
    prefix: int


def completion_body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                         "ignore_eos": True, "stream_options": {"include_usage": True}})


async def drive(host: str, port: int, model: str, w: Workload, answer_tokens: AnswerTokens | None,
                timeout_s: float = 300.0) -> tuple[list[Answer], float]:
    """Run the workload, ``w.concurrency`` slots; multi-turn slots run one session's turns in order."""
    loop = asyncio.get_running_loop()

    async def connect() -> _UsageConn:
        _, conn = await loop.create_connection(_UsageConn, host, port)
        return conn

    answers: list[Answer] = []
    t0 = time.perf_counter()

    async def one(slot: list[_UsageConn], prompt: list[int], prefix: int) -> Answer:
        conn = slot[0]
        if conn.closed:
            conn = slot[0] = await connect()
        sent = time.perf_counter() - t0
        try:
            rec = await asyncio.wait_for(conn.send(chat_request(host, port, completion_body(
                model, prompt, w.output_tokens), path="/v1/completions")), timeout_s)
            cached = conn.cached_tokens()
        except asyncio.TimeoutError:
            rec, cached = Record(error=f"timeout after {timeout_s}s"), -1
            conn.transport.close()  # type: ignore[union-attr]
            slot[0] = await connect()
        if not rec.error and rec.completion_tokens != w.output_tokens:
            rec.error = f"completion_tokens {rec.completion_tokens} != {w.output_tokens}"
        if not rec.error and rec.prompt_tokens != len(prompt):
            rec.error = f"prompt_tokens {rec.prompt_tokens} != {len(prompt)}"
        answer = Answer(rec, cached, sent, prefix)
        answers.append(answer)
        return answer

    items = list(range(w.num_sessions if w.num_sessions else len(w.prompts)))
    items.reverse()

    async def run_slot() -> None:
        slot = [await connect()]
        while items:
            i = items.pop()
            if not w.num_sessions:
                await one(slot, w.prompts[i], w.prefix_of[i])
                continue
            prompt: list[int] = []
            for turn, user in enumerate(w.sessions[i]):
                prompt = prompt + user
                answer = await one(slot, prompt, w.prefix_of[i])
                if answer.rec.error:
                    break
                if turn + 1 < len(w.sessions[i]):
                    assert answer_tokens is not None
                    prompt = prompt + answer_tokens(prompt, w.output_tokens)
        if slot[0].transport is not None:
            slot[0].transport.close()

    await asyncio.gather(*(run_slot() for _ in range(w.concurrency)))
    return answers, time.perf_counter() - t0


def stream_of(w: Workload, answer_tokens: AnswerTokens | None) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) in issue order, for the reuse ceiling (answers only matter for multi-turn)."""
    if not w.num_sessions:
        return [(p, []) for p in w.prompts]
    out = []
    for session in w.sessions:
        prompt: list[int] = []
        for user in session:
            prompt = prompt + user
            answer = answer_tokens(prompt, w.output_tokens) if answer_tokens else []
            out.append((prompt, answer))
            prompt = prompt + answer
    # Sessions run concurrently, not one after another; a session's own turns stay in order, and a
    # session's first turn can only reuse its prefix, so the ceiling does not depend on the interleaving.
    return out


# --------------------------------------------------------------------------------------------- metrics


def pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1e3, 2) if values else None


def summarize(answers: list[Answer], wall_s: float, w: Workload) -> dict[str, Any]:
    ok = [a for a in answers if not a.rec.error]
    errors: dict[str, int] = {}
    for a in answers:
        if a.rec.error:
            kind = a.rec.error.split(":")[0][:80]
            errors[kind] = errors.get(kind, 0) + 1
    prompt = sum(a.rec.prompt_tokens for a in ok)
    cached = sum(max(a.cached_tokens, 0) for a in ok)
    ttft = [a.rec.ttft_s for a in ok if a.rec.ttft_s >= 0]
    e2e = [a.rec.e2e_s for a in ok]
    # Second half only: past the cold start, what the routing sustains.
    late = [a for a in ok if a.sent_s >= wall_s / 2]
    late_prompt = sum(a.rec.prompt_tokens for a in late)
    return {
        "completed_ok": len(ok), "errors": len(answers) - len(ok), "error_kinds": errors,
        "missing_cached_tokens": sum(1 for a in ok if a.cached_tokens < 0),
        "reuse": round(cached / prompt, 4) if prompt else None,
        "reuse_second_half": round(sum(max(a.cached_tokens, 0) for a in late) / late_prompt, 4) if late_prompt else None,
        "prompt_tokens": prompt, "cached_tokens": cached,
        "ttft_ms": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99), "max": pct(ttft, 1.0),
                    "mean": round(sum(ttft) / len(ttft) * 1e3, 2) if ttft else None},
        "e2e_ms": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)},
        "wall_s": round(wall_s, 2),
        "requests_per_s": round(len(ok) / wall_s, 2),
        "output_tokens_per_s": round(sum(a.rec.completion_tokens for a in ok) / wall_s, 1),
        "cold_requests": sum(1 for a in ok if a.cached_tokens < w.prefix_tokens // 2),
    }


def scrape(port: int) -> dict[str, float]:
    """Router counters and gauges worth keeping (Prometheus text format, no labels except worker_id)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return {"error": str(exc)}  # type: ignore[dict-item]
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("splitserve_router_"):
            continue
        name, _, value = line.rpartition(" ")
        if name.endswith("_created") or "_bucket" in name:
            continue
        out[name.removeprefix("splitserve_router_")] = float(value)
    return out


def router_view(metrics: dict[str, float]) -> dict[str, Any]:
    blocks = metrics.get("request_blocks_total", 0.0)
    routes = metrics.get("decision_seconds_count", 0.0)
    return {
        "predicted_hit_rate": round(metrics.get("predicted_hit_blocks_total", 0.0) / blocks, 4) if blocks else None,
        "best_overlap_rate": round(metrics.get("best_overlap_blocks_total", 0.0) / blocks, 4) if blocks else None,
        "routes": routes,
        "decision_mean_us": round(metrics.get("decision_seconds_sum", 0.0) / routes * 1e6, 1) if routes else None,
        "kv_events_applied": metrics.get("kv_events_applied_total"),
        "kv_event_gaps": metrics.get("kv_event_gaps_total"),
    }


# ------------------------------------------------------------------------------------------------- run


def mock_num_blocks(w: Workload, prefixes_per_worker: int, block_size: int) -> tuple[int, str]:
    """KV blocks for ``prefixes_per_worker`` cached prefixes + the private blocks of every in-flight request."""
    prefix_blocks = w.prefix_tokens // block_size  # full blocks shared by a prefix's requests
    longest = w.prefix_tokens + w.suffix_tokens * w.num_turns + w.output_tokens * w.num_turns
    request_blocks = -(-(longest - 1) // block_size)  # the last sampled token needs no slot
    private = request_blocks - prefix_blocks
    num = prefixes_per_worker * prefix_blocks + w.concurrency * private
    why = (f"{prefixes_per_worker} prefixes x {prefix_blocks} full blocks + concurrency {w.concurrency} x "
           f"{private} private blocks per request ({request_blocks} blocks for the longest prompt+output) = {num}")
    return num, why


def _start_graph(tmp: Path, graph_args: list[str]) -> Graph:
    """tests/graph.start_graph, but the graph is stopped when startup is interrupted (timeout, Ctrl-C)."""
    port, router_port = free_port(), free_port()
    log_path = tmp / f"graph-{port}.log"
    cmd = [sys.executable, "-m", "cli.main", "up", "--model", str(tiny_model_dir()), "--port", str(port),
           "--router-port", str(router_port), *graph_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log,
                                stderr=subprocess.STDOUT)
    graph = Graph(proc, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{router_port}", log_path)
    try:
        deadline = time.monotonic() + 600.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"graph exited ({proc.returncode}):\n{graph.logs()[-5000:]}")
            if "splitserve is serving" in graph.logs():  # every worker registered
                return graph
            time.sleep(0.2)
        raise RuntimeError(f"graph not healthy in 600 s:\n{graph.logs()[-5000:]}")
    except BaseException:
        graph.stop()
        raise


def run_one(w: Workload, policy: str, args: argparse.Namespace, num_blocks: int | None,
            answer_tokens: AnswerTokens | None, tmp: Path) -> dict[str, Any]:
    metrics_port = free_port()
    graph_args = ["--engine", w.engine, "--aggregated", str(w.num_workers), "--router-policy", policy,
                  "--block-size", str(args.block_size), "--router-metrics-port", str(metrics_port)]
    if w.engine == "mock":
        graph_args += ["--mock-speedup", str(args.speedup)]
    else:
        graph_args += ["--dtype", "float32"]
    if num_blocks is not None:
        graph_args += ["--num-blocks", str(num_blocks)]
    if args.prefill_weight is not None:
        graph_args += ["--router-prefill-weight", str(args.prefill_weight)]
    if args.busy_threshold is not None:
        graph_args += ["--router-busy-threshold", str(args.busy_threshold)]
    if not args.kvtier and _up_supports("--no-kvtier"):
        graph_args += ["--no-kvtier"]  # the device KV alone: what the routing has to manage
    t_start = time.perf_counter()
    graph = _start_graph(tmp, graph_args)
    startup_s = time.perf_counter() - t_start
    load0 = os.getloadavg()[0]
    try:
        port = int(graph.url.rsplit(":", 1)[1])
        import uvloop

        answers, wall = uvloop.run(drive("127.0.0.1", port, "tiny", w, answer_tokens))
        time.sleep(0.3)  # last heartbeats and events
        metrics = scrape(metrics_port)
        try:
            stats = {wid: {"prefix_hits": s.num_prefix_hits, "free_blocks": s.load.num_free_blocks}
                     for wid, s in worker_stats(graph.router).items()}
        except Exception as exc:  # stats are a diagnostic, not the result
            stats = {"error": repr(exc)}
    finally:
        graph.stop()
    out = summarize(answers, wall, w)
    hits = [v.get("prefix_hits", 0) for v in stats.values() if isinstance(v, dict)]
    if w.engine == "vllm" and out["cached_tokens"] == 0 and sum(hits) > 0 and out["prompt_tokens"]:
        # usage.cached_tokens reads 0 behind vLLM workers; their prefix-hit token counters do not, but they
        # can exceed the reuse ceiling (vLLM counts lookups, not first schedules): a diagnostic, not the result.
        out["worker_prefix_hit_tokens_per_prompt_token"] = round(sum(hits) / out["prompt_tokens"], 4)
        out["reuse_note"] = "usage.cached_tokens was 0 for every answer behind vLLM workers"
    # Requests per prefix per worker is not visible to the client; prefix hits per worker are.
    out.update(policy=policy, graph_startup_s=round(startup_s, 1), load_avg_1m_before=round(load0, 2),
               load_avg_1m_after=round(os.getloadavg()[0], 2), router=router_view(metrics), workers=stats,
               router_metrics=metrics, command="splitserve up " + " ".join(graph_args))
    return out


_UP_HELP: list[str] = []


def _up_supports(flag: str) -> bool:
    if not _UP_HELP:
        _UP_HELP.append(subprocess.run([sys.executable, "-m", "cli.main", "up", "--help"], cwd=REPO,
                                       capture_output=True, text=True, timeout=60,
                                       env={**os.environ, "COLUMNS": "200"}).stdout)
    return flag in _UP_HELP[0]


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def aggregate(runs: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {}
    for p in policies:
        mine = [r for r in runs if r["policy"] == p]
        per[p] = {
            "reuse": median([r["reuse"] for r in mine]),
            "ttft_p50_ms": median([r["ttft_ms"]["p50"] for r in mine]),
            "ttft_p99_ms": median([r["ttft_ms"]["p99"] for r in mine]),
            "requests_per_s": median([r["requests_per_s"] for r in mine]),
            "output_tokens_per_s": median([r["output_tokens_per_s"] for r in mine]),
            "errors": sum(r["errors"] for r in mine), "repeats": len(mine),
        }
    ratios: dict[str, Any] = {}
    kv = per.get("kv")
    for other in policies:
        if other == "kv" or kv is None:
            continue
        o = per[other]
        ratios[f"kv_vs_{other}"] = {
            "reuse": _ratio(kv["reuse"], o["reuse"]),
            "ttft_p50_speedup": _ratio(o["ttft_p50_ms"], kv["ttft_p50_ms"]),
            "ttft_p99_speedup": _ratio(o["ttft_p99_ms"], kv["ttft_p99_ms"]),
            "throughput": _ratio(kv["requests_per_s"], o["requests_per_s"]),
        }
        # Per-repeat ratios (A B C interleaved): how stable the comparison is on a noisy machine.
        pairs = [(a, b) for a, b in zip([r for r in runs if r["policy"] == "kv"],
                                        [r for r in runs if r["policy"] == other])]
        ratios[f"kv_vs_{other}"]["ttft_p50_speedup_per_repeat"] = [
            _ratio(b["ttft_ms"]["p50"], a["ttft_ms"]["p50"]) for a, b in pairs]
    return {"per_policy": per, "ratios": ratios}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _policy_default(name: str) -> Any:
    from services.router.policy import PolicyConfig

    return getattr(PolicyConfig(), name)


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"machine": f"{platform.machine()} cpus={os.cpu_count()} {cpu}", "python": platform.python_version(),
            "git_head": commit, "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}


def workloads(args: argparse.Namespace) -> dict[str, Workload]:
    common = dict(num_requests=args.requests, concurrency=args.concurrency, prefix_tokens=args.prefix_tokens,
                  suffix_tokens=args.suffix_tokens, output_tokens=args.output_tokens, num_prefixes=args.prefixes,
                  num_workers=args.workers)
    return {
        "shared": Workload("shared", **common),
        "zipf": Workload("zipf", zipf_s=1.1, **common),
        "multiturn": Workload("multiturn", num_sessions=args.sessions, num_turns=args.turns, **common),
        "vllm": Workload("vllm", engine="vllm", num_workers=2, num_prefixes=4, prefix_tokens=1000,
                         suffix_tokens=args.suffix_tokens, output_tokens=args.output_tokens, num_requests=120,
                         concurrency=4, policies=("kv", "round-robin")),
        # KV pressure on real engines: 8 prefixes of 1,000 tokens (32 blocks each) against 160 blocks per
        # worker (the least vLLM takes at max_model_len 4096 is 128): each worker holds ~4 of the 8.
        "vllm-pressure": Workload("vllm-pressure", engine="vllm", num_workers=2, num_prefixes=8, prefix_tokens=1000,
                                  suffix_tokens=args.suffix_tokens, output_tokens=args.output_tokens,
                                  num_requests=160, concurrency=4, policies=("kv", "round-robin")),
        # Prefixes beyond all engines' KV (16 of 1,000 tokens against room for ~8 in both workers together):
        # run with and without --kvtier to see what the shared tier gives back (issue [kvtier]).
        "vllm-tier": Workload("vllm-tier", engine="vllm", num_workers=2, num_prefixes=16, prefix_tokens=1000,
                              suffix_tokens=args.suffix_tokens, output_tokens=args.output_tokens,
                              num_requests=192, concurrency=4, policies=("kv",)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="shared,zipf,multiturn", help="shared,zipf,multiturn,vllm,vllm-pressure,vllm-tier")
    ap.add_argument("--policies", default="", help="override, e.g. kv,round-robin (default: per workload)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--speedup", type=float, default=1.0, help="mock timing divided by this")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--suffix-tokens", type=int, default=50)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--prefixes-per-worker", type=float, default=4, help="KV room per mock worker, in prefixes")
    ap.add_argument("--num-blocks", type=int, default=0, help="override the computed KV blocks per mock worker")
    ap.add_argument("--vllm-num-blocks", type=int, default=0, help="KV blocks per vLLM worker (0: from memory)")
    ap.add_argument("--prefill-weight", type=float, default=None, help="router kv prefill weight (default: its own)")
    ap.add_argument("--busy-threshold", type=float, default=None, help="router busy threshold (default: its own)")
    ap.add_argument("--kvtier", action="store_true", help="keep `up`'s shared KV tier (default: --no-kvtier)")
    ap.add_argument("--out", type=Path, default=RESULTS / "routing.json")
    ap.add_argument("--note", default="", help="free text stored with the results")
    ap.add_argument("--tag", default="", help="suffix of the workload's key in the results (e.g. @speedup1)")
    args = ap.parse_args()
    # A timeout's SIGTERM must still stop the graph (the finally in run_one), like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    model_dir = tiny_model_dir()
    from common.tiny_model import validate_model_dir

    vocab = validate_model_dir(model_dir).vocab_size
    answer_tokens = AnswerTokens(model_dir)
    chosen = [s for s in args.workloads.split(",") if s]
    all_workloads = workloads(args)
    results: dict[str, Any] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except ValueError:
            results = {}
    results.setdefault("benchmark", "routing")
    results["goals"] = GOALS
    results["dynamo_reference"] = DYNAMO_REFERENCE
    results.setdefault("workloads", {})
    for name in chosen:
        w = build(all_workloads[name], vocab)
        if args.policies:
            w.policies = tuple(args.policies.split(","))
        if w.engine == "mock":
            num_blocks, why = mock_num_blocks(w, int(args.prefixes_per_worker), args.block_size)
            if args.num_blocks:
                num_blocks, why = args.num_blocks, f"--num-blocks {args.num_blocks} (override; computed: {why})"
        else:
            num_blocks = args.vllm_num_blocks or None
            why = f"{num_blocks} (--vllm-num-blocks)" if num_blocks else "vLLM default (from --kv-cache-gib 1)"
        stream = stream_of(w, answer_tokens if w.engine == "mock" else None)
        ceiling = reuse_ceiling(stream, args.block_size)
        conditions = {
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/routing.py " + " ".join(sys.argv[1:]),
            "model": "tiny (embedded Llama, vocab 8192)" + (
                f"; mock timing = default TimingModel (~100M model on 2 CPU cores) / speedup {args.speedup}"
                if w.engine == "mock" else "; real vLLM on CPU, float32, prefix caching on; the workers "
                "publish KV events (exact-mode routing)"),
            "block_size": args.block_size, "num_blocks_per_worker": num_blocks, "num_blocks_why": why,
            "prefill_decode_workers": "aggregated (no prefill pool), no transfers",
            "transfer_backend": "none (aggregated)", "policies": list(w.policies), "repeats": args.repeats,
            "order": "interleaved: " + " ".join(list(w.policies) * args.repeats) + ", fresh graph (cold caches) each",
            "router_prefill_weight": args.prefill_weight if args.prefill_weight is not None else _policy_default(
                "prefill_weight"),
            "router_busy_threshold": args.busy_threshold if args.busy_threshold is not None else _policy_default(
                "busy_threshold"),
            "kvtier": args.kvtier,
            "workload": w.describe(), "note": args.note, **machine(),
        }
        print(f"== {name}: {json.dumps(w.describe())}\n   num_blocks {why}; reuse ceiling {ceiling:.4f}", flush=True)
        runs: list[dict[str, Any]] = []

        def save(complete: bool) -> dict[str, Any]:
            """Written after every run, so a cut-short invocation still leaves the runs it finished."""
            policies = tuple(p for p in w.policies if any(r["policy"] == p for r in runs))
            agg = aggregate(runs, policies)
            kv = agg["per_policy"].get("kv", {})
            rr = agg["ratios"].get("kv_vs_round-robin", {})
            agg["reuse_max"] = round(ceiling, 4)
            agg["reuse_of_max"] = {p: _ratio(v["reuse"], ceiling) for p, v in agg["per_policy"].items()}
            agg["goal_met"] = {
                "reuse": kv.get("reuse") is not None and kv["reuse"] >= GOALS["reuse_min"],
                "reuse_goal_reachable": ceiling >= GOALS["reuse_min"],
                "ttft_p50_speedup": (rr.get("ttft_p50_speedup") or 0) >= GOALS["ttft_p50_speedup_vs_round_robin_min"],
            }
            agg["complete"] = complete
            results["workloads"][name + args.tag] = {"conditions": conditions, "summary": agg, "runs": runs}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
            return agg

        with tempfile.TemporaryDirectory(prefix="routing-") as tmp:
            for rep in range(args.repeats):
                for policy in w.policies:
                    run = run_one(w, policy, args, num_blocks, answer_tokens, Path(tmp))
                    run["repeat"] = rep
                    runs.append(run)
                    print(f"   {policy:12s} rep {rep}: reuse {run['reuse']} (2nd half {run['reuse_second_half']}) "
                          f"ttft p50 {run['ttft_ms']['p50']} p99 {run['ttft_ms']['p99']} ms, "
                          f"{run['requests_per_s']} req/s, wall {run['wall_s']} s, errors {run['errors']}, "
                          f"router {run['router']}", flush=True)
                    save(complete=False)
        print(f"   summary: {json.dumps(save(complete=True))}", flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
