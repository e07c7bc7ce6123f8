"""The workloads of bench/routing.py and the client that drives them: shared prefixes, zipf popularity, multi-turn.

A workload is prefixes of random token ids (``prefix_tokens`` each) and requests that each pick one and add a
unique suffix; multi-turn sessions send their turns in order, each turn's prompt the previous prompt plus the
mock engine's answer (recomputed here: ``AnswerTokens``) plus new user tokens. ``reuse_ceiling`` is what an
infinite single cache would reuse on the same request stream.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.client import Client, StreamResult
from bench.lib.load import check_tokens
from common.hashing import block_hashes

_TOKEN_LOW = 10  # prompt token ids are drawn from [_TOKEN_LOW, vocab): clear of the special tokens


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
    # Graph settings this workload fixes, over the command line's (block_size, speedup, num_blocks).
    graph: dict[str, Any] = field(default_factory=dict)
    # Its goals (bench/routing_report.py GOALS when empty).
    goals: dict[str, float] = field(default_factory=dict)
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


# Issue 16's cache-limited deployment: 6 aggregated workers, block 64, 12 prefixes of which each worker has room
# for ~3 (96 blocks at ISL 1,550; scaled with the prompt at ISL 4,000), 720 requests at concurrency 18, mock
# timing / 8. Its sizes are fixed (not the command line's): the goals are about this shape.
ISSUE16_GOALS = {"reuse_min": 0.85, "ttft_p50_ratio_vs_round_robin_max": 0.5, "ttft_p99_ratio_vs_round_robin_max": 1.0}


def _limited(name: str, prefix_tokens: int, num_blocks: int, zipf_s: float = 0.0) -> Workload:
    return Workload(name, num_workers=6, num_prefixes=12, prefix_tokens=prefix_tokens, suffix_tokens=50,
                    output_tokens=16, num_requests=720, concurrency=18, zipf_s=zipf_s, policies=("kv", "round-robin"),
                    graph={"block_size": 64, "speedup": 8.0, "num_blocks": num_blocks}, goals=ISSUE16_GOALS)


def workloads(args: argparse.Namespace) -> dict[str, Workload]:
    """Every preset by name, sized by the command line (the limited-* presets fix their own sizes)."""
    common = dict(num_requests=args.requests, concurrency=args.concurrency, prefix_tokens=args.prefix_tokens,
                  suffix_tokens=args.suffix_tokens, output_tokens=args.output_tokens, num_prefixes=args.prefixes,
                  num_workers=args.workers)
    return {
        "limited": _limited("limited", 1500, 96),
        "limited-zipf": _limited("limited-zipf", 1500, 96, zipf_s=1.1),
        "limited-isl4k": _limited("limited-isl4k", 3950, 248),
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



@dataclass
class Answer:
    res: StreamResult
    sent_s: float  # since the load started
    prefix: int


async def drive(url: str, model: str, w: Workload, answer_tokens: AnswerTokens | None,
                timeout_s: float = 300.0) -> tuple[list[Answer], float]:
    """Run the workload, ``w.concurrency`` slots; multi-turn slots run one session's turns in order."""
    client = Client(url)
    answers: list[Answer] = []
    t0 = time.perf_counter()

    async def one(prompt: list[int], prefix: int) -> Answer:
        sent = time.perf_counter() - t0
        res = await client.stream("/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": w.output_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}, timeout_s)
        answer = Answer(check_tokens(res, w.output_tokens, len(prompt)), sent, prefix)
        answers.append(answer)
        return answer

    items = list(range(w.num_sessions if w.num_sessions else len(w.prompts)))
    items.reverse()

    async def run_slot() -> None:
        while items:
            i = items.pop()
            if not w.num_sessions:
                await one(w.prompts[i], w.prefix_of[i])
                continue
            prompt: list[int] = []
            for turn, user in enumerate(w.sessions[i]):
                prompt = prompt + user
                answer = await one(prompt, w.prefix_of[i])
                if not answer.res.ok:
                    break
                if turn + 1 < len(w.sessions[i]):
                    assert answer_tokens is not None
                    prompt = prompt + answer_tokens(prompt, w.output_tokens)

    try:
        await asyncio.gather(*(run_slot() for _ in range(w.concurrency)))
    finally:
        await client.aclose()
    return answers, time.perf_counter() - t0
