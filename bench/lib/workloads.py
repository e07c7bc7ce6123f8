"""Workload generators for `splitserve bench`: deterministic by seed, prompts as token-id lists.

Every workload is a list of ``Session``s; a session is one or more ``Turn``s sent one after the other (a
single-turn workload has one-turn sessions). A turn's prompt is a list of ``Segment``s (role + token ids):
the completions endpoint gets their concatenation as token ids (exact ISL), the chat endpoint gets them as
messages of text (one word per token id, so ISL is only approximate there).

- ``synthetic``: unique random prompts, ISL and OSL drawn from distributions.
- ``shared-prefix``: ``num_prefixes`` random prefixes of ``prefix_len`` tokens; each request picks one with a
  Zipf weight 1/(rank+1)^skew (skew 0: uniform) and appends a unique suffix.
- ``multi-turn``: sessions of ``turns`` turns; turn k's prompt is the whole history (every earlier user
  message followed by a stand-in for the assistant's answer of that turn's OSL) plus a new user message, so
  the history grows and an earlier turn's prompt is a prefix of the next one's. The stand-in answer is
  synthetic (the real answer's tokens are not known to the client); the server's cache can reuse the earlier
  prompt, not the answer. Think time between turns from a distribution (seconds).
- ``long-mix``: unique random prompts, a ``long_fraction`` of them (each request a seeded coin flip) of
  ``long_isl`` tokens among short ones of ``isl``: the long prefills are what stalls a co-located decode (ITL p99).
- ``trace``: Mooncake-style JSONL, one request per line: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids``. Hash id h is a block of ``block_tokens`` (512) deterministic synthetic
  tokens (a function of seed and h only), so requests with equal leading hash ids share that prefix; the
  prompt is the blocks' concatenation cut or padded (with unique tokens) to ``input_length``.

Token ids come from ``vocab_range`` (default [100, 8000): clear of special tokens, inside every vocabulary).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WORKLOADS = ("synthetic", "shared-prefix", "multi-turn", "long-mix", "trace")
DEFAULT_VOCAB_RANGE = (100, 8000)
TRACE_BLOCK_TOKENS = 512

# Common English words: chat prompts map token id i to _WORDS[i % len(_WORDS)].
_WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be or had "
          "not but one have they you all new more their has also two first been other after its who time "
          "when there would can into some year only over most city may these school such about state then "
          "made three world where between up house during people well many both under later while part "
          "music film work since known called team game number each south north river group season well "
          "west east old high long same small great early place including family way war country second "
          "name government public best could through played several life around area against four series "
          "did back found home still club until use among based make five along own large line before").split()


# ----------------------------------------------------------------------------------------- distributions

@dataclass(frozen=True)
class Dist:
    """``"512"`` (fixed), ``"normal:MEAN:STD"``, ``"uniform:LO:HI"`` (inclusive for integers),
    ``"exponential:MEAN"``. Integer samples are rounded and at least ``minimum``."""

    kind: str
    params: tuple[float, ...]

    @classmethod
    def parse(cls, text: str | float | int) -> Dist:
        if isinstance(text, (int, float)):
            return cls("fixed", (float(text),))
        parts = str(text).strip().split(":")
        try:
            values = tuple(float(p) for p in parts[1:])
            if len(parts) == 1:
                return cls("fixed", (float(parts[0]),))
        except ValueError:
            raise ValueError(f"bad distribution {text!r}: numbers expected") from None
        kind = parts[0].lower()
        need = {"fixed": 1, "normal": 2, "uniform": 2, "exponential": 1}
        if kind not in need or len(values) != need[kind]:
            raise ValueError(f"bad distribution {text!r}: use N, normal:MEAN:STD, uniform:LO:HI or exponential:MEAN")
        if kind == "uniform" and values[0] > values[1]:
            raise ValueError(f"bad distribution {text!r}: LO > HI")
        return cls(kind, values)

    def sample(self, rng: random.Random) -> float:
        p = self.params
        if self.kind == "fixed":
            return p[0]
        if self.kind == "normal":
            return rng.gauss(p[0], p[1])
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1])
        return rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0

    def sample_int(self, rng: random.Random, minimum: int = 1) -> int:
        if self.kind == "uniform":
            return max(minimum, rng.randint(int(self.params[0]), int(self.params[1])))
        return max(minimum, int(round(self.sample(rng))))

    def mean(self) -> float:
        p = self.params
        return (p[0] + p[1]) / 2 if self.kind == "uniform" else p[0]

    def describe(self) -> dict[str, Any]:
        names = {"fixed": ("value",), "normal": ("mean", "std"), "uniform": ("low", "high"),
                 "exponential": ("mean",)}[self.kind]
        return {"kind": self.kind, **dict(zip(names, self.params)), "spec": str(self)}

    def __str__(self) -> str:
        fmt = lambda x: str(int(x)) if float(x).is_integer() else str(x)  # noqa: E731
        if self.kind == "fixed":
            return fmt(self.params[0])
        return ":".join([self.kind, *map(fmt, self.params)])


# ----------------------------------------------------------------------------------------- workload shapes

@dataclass(frozen=True)
class Segment:
    role: str  # "user" | "assistant"
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Turn:
    segments: tuple[Segment, ...]
    osl: int
    think_s: float = 0.0  # wait before sending this turn (after the previous turn's answer)

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.tokens]

    @property
    def isl(self) -> int:
        return sum(len(s.tokens) for s in self.segments)


@dataclass(frozen=True)
class Session:
    turns: tuple[Turn, ...]
    at_s: float | None = None  # trace replay: when to start (seconds from the run's start)
    tag: str = ""  # e.g. "prefix-3" for shared-prefix, for the curious


@dataclass
class WorkloadSpec:
    kind: str = "synthetic"
    isl: str = "512"
    osl: str = "128"
    num_prefixes: int = 4
    prefix_len: int = 512
    suffix_len: str = "64"
    prefix_skew: float = 0.0
    turns: str = "4"
    think_time_s: str = "0"
    long_isl: str = "2048"
    long_fraction: float = 0.2
    trace: str | None = None
    trace_time_scale: float = 1.0
    block_tokens: int = TRACE_BLOCK_TOKENS
    vocab_range: tuple[int, int] = DEFAULT_VOCAB_RANGE
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The conditions this workload runs under (distributions described, not just strings)."""
        out: dict[str, Any] = {"kind": self.kind, "vocab_range": list(self.vocab_range)}
        if self.kind in ("synthetic", "multi-turn", "long-mix"):
            out["isl"] = Dist.parse(self.isl).describe()
        if self.kind == "long-mix":
            out.update(long_isl=Dist.parse(self.long_isl).describe(), long_fraction=self.long_fraction)
        if self.kind != "trace":
            out["osl"] = Dist.parse(self.osl).describe()
        if self.kind == "shared-prefix":
            out.update(num_prefixes=self.num_prefixes, prefix_len=self.prefix_len,
                       suffix_len=Dist.parse(self.suffix_len).describe(), prefix_skew_zipf=self.prefix_skew)
        if self.kind == "multi-turn":
            out.update(turns=Dist.parse(self.turns).describe(), think_time_s=Dist.parse(self.think_time_s).describe(),
                       history="previous user messages + synthetic stand-in answers of each turn's OSL")
        if self.kind == "trace":
            out.update(trace=self.trace, trace_time_scale=self.trace_time_scale, block_tokens=self.block_tokens,
                       isl="from trace", osl="from trace")
        return out


class TokenSource:
    """Deterministic token blocks: ``block(key, n)`` depends only on (seed, salt, key, n)."""

    def __init__(self, seed: int, salt: int = 0, vocab_range: tuple[int, int] = DEFAULT_VOCAB_RANGE) -> None:
        self.seed, self.salt = seed, salt
        self.lo, self.hi = vocab_range
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"bad vocab range {vocab_range}")

    def block(self, kind: int, key: int, n: int) -> tuple[int, ...]:
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, self.salt, kind, key & 0xFFFFFFFFFFFF])
        return tuple(rng.integers(self.lo, self.hi, n).tolist())


_PREFIX, _UNIQUE, _HASH, _ANSWER, _WARM = 1, 2, 3, 4, 5


def _zipf_weights(n: int, skew: float) -> list[float]:
    w = [1.0 / (i + 1) ** skew for i in range(n)]
    total = sum(w)
    return [x / total for x in w]


def make_workload(spec: WorkloadSpec, num_requests: int, seed: int, salt: int = 0) -> list[Session]:
    """Sessions holding at least ``num_requests`` turns in all (trace: its first ``num_requests`` lines).

    ``salt`` changes every token (sweep points use their index) so one point never hits a cache warmed by
    another; the same (spec, num_requests, seed, salt) always gives the same sessions.
    """
    rng = random.Random(f"{seed}:{salt}:{spec.kind}")
    src = TokenSource(seed, salt, spec.vocab_range)
    osl = Dist.parse(spec.osl)
    if spec.kind == "synthetic":
        isl = Dist.parse(spec.isl)
        return [Session((Turn((Segment("user", src.block(_UNIQUE, i, isl.sample_int(rng))),), osl.sample_int(rng)),))
                for i in range(num_requests)]
    if spec.kind == "long-mix":
        return long_mix_sessions(spec, num_requests, rng, src)
    if spec.kind == "shared-prefix":
        if spec.num_prefixes < 1 or spec.prefix_len < 0:
            raise ValueError("shared-prefix needs num_prefixes >= 1 and prefix_len >= 0")
        prefixes = [src.block(_PREFIX, p, spec.prefix_len) for p in range(spec.num_prefixes)]
        weights = _zipf_weights(spec.num_prefixes, spec.prefix_skew)
        suffix = Dist.parse(spec.suffix_len)
        sessions = []
        for i in range(num_requests):
            p = rng.choices(range(spec.num_prefixes), weights)[0]
            tokens = prefixes[p] + src.block(_UNIQUE, i, suffix.sample_int(rng))
            sessions.append(Session((Turn((Segment("user", tokens),), osl.sample_int(rng)),), tag=f"prefix-{p}"))
        return sessions
    if spec.kind == "multi-turn":
        isl, turns, think = Dist.parse(spec.isl), Dist.parse(spec.turns), Dist.parse(spec.think_time_s)
        sessions, total, s = [], 0, 0
        while total < num_requests:
            n = min(turns.sample_int(rng), num_requests - total)
            history: list[Segment] = []
            out_turns = []
            for k in range(n):
                user = Segment("user", src.block(_UNIQUE, s * 100_000 + k, isl.sample_int(rng)))
                o = osl.sample_int(rng)
                out_turns.append(Turn(tuple(history) + (user,), o, max(0.0, think.sample(rng)) if k else 0.0))
                history += [user, Segment("assistant", src.block(_ANSWER, s * 100_000 + k, o))]
            sessions.append(Session(tuple(out_turns), tag=f"session-{s}"))
            total += n
            s += 1
        return sessions
    if spec.kind == "trace":
        if not spec.trace:
            raise ValueError("the trace workload needs --trace FILE")
        return trace_sessions(load_trace(Path(spec.trace), num_requests), src, spec.block_tokens,
                              spec.trace_time_scale)
    raise ValueError(f"unknown workload {spec.kind!r}; known: {', '.join(WORKLOADS)}")


def prefix_warmup(spec: WorkloadSpec, seed: int, salt: int, suffix_len: int = 16) -> list[Session]:
    """One request per shared prefix of the point ``make_workload(spec, n, seed, salt)`` draws, each with its own
    ``suffix_len`` tokens (no measured prompt equals one) and one output token: sent before a point, they put the
    whole prefix working set in the server's caches, as a fleet that has served these prefixes before has them."""
    if spec.kind != "shared-prefix":
        raise ValueError("warming prefixes needs the shared-prefix workload")
    src = TokenSource(seed, salt, spec.vocab_range)
    return [Session((Turn((Segment("user", src.block(_PREFIX, p, spec.prefix_len) + src.block(_WARM, p, suffix_len)),),
                          1),), tag=f"prefix-{p}") for p in range(spec.num_prefixes)]


def long_mix_sessions(spec: WorkloadSpec, num_requests: int, rng: random.Random, src: TokenSource) -> list[Session]:
    """One-turn sessions: request i is long (``long_isl``) with probability ``long_fraction``, else ``isl``;
    tagged "long" / "short" so a report can split the latencies."""
    if not 0.0 <= spec.long_fraction <= 1.0:
        raise ValueError(f"long_fraction {spec.long_fraction} is not in [0, 1]")
    short, long_, osl = Dist.parse(spec.isl), Dist.parse(spec.long_isl), Dist.parse(spec.osl)
    sessions = []
    for i in range(num_requests):
        is_long = rng.random() < spec.long_fraction
        n = (long_ if is_long else short).sample_int(rng)
        sessions.append(Session((Turn((Segment("user", src.block(_UNIQUE, i, n)),), osl.sample_int(rng)),),
                                tag="long" if is_long else "short"))
    return sessions


def load_trace(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
                rows.append({"timestamp": float(row.get("timestamp", 0)), "input_length": int(row["input_length"]),
                             "output_length": int(row["output_length"]),
                             "hash_ids": [int(h) for h in row.get("hash_ids", [])]})
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: not a trace line ({exc})") from None
            if limit is not None and len(rows) >= limit:
                break
    return rows


def trace_prompt(row: dict[str, Any], src: TokenSource, block_tokens: int, index: int) -> tuple[int, ...]:
    """The blocks of ``row["hash_ids"]`` joined, cut or padded (unique tokens) to ``input_length``."""
    tokens: list[int] = []
    for h in row["hash_ids"]:
        if len(tokens) >= row["input_length"]:
            break
        tokens.extend(src.block(_HASH, h, block_tokens))
    if len(tokens) < row["input_length"]:
        tokens.extend(src.block(_UNIQUE, index, row["input_length"] - len(tokens)))
    return tuple(tokens[:row["input_length"]])


def trace_sessions(rows: list[dict[str, Any]], src: TokenSource, block_tokens: int = TRACE_BLOCK_TOKENS,
                   time_scale: float = 1.0) -> list[Session]:
    t0 = rows[0]["timestamp"] if rows else 0.0
    return [Session((Turn((Segment("user", trace_prompt(r, src, block_tokens, i)),), max(1, r["output_length"])),),
                    at_s=(r["timestamp"] - t0) / 1000.0 * time_scale)
            for i, r in enumerate(rows)]


def poisson_arrivals(n: int, rate: float, seed: int, salt: int = 0) -> list[float]:
    """Start times (s) of ``n`` arrivals of a Poisson process of ``rate`` per second; the first at 0."""
    rng = random.Random(f"poisson:{seed}:{salt}")
    t, out = 0.0, []
    for i in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def poisson_prompts(rng: random.Random, isl: int, osl: int, rate: float, start_s: float,
                    end_s: float) -> tuple[list[Session], list[float]]:
    """One-turn sessions of unique random prompts (ids in [16, 8000): no prefix hits) and their send times (s):
    a Poisson process of ``rate`` per second over [start_s, end_s)."""
    sessions, arrivals, t = [], [], start_s
    while True:
        t += rng.expovariate(rate)
        if t >= end_s:
            return sessions, arrivals
        tokens = tuple(rng.randrange(16, 8000) for _ in range(isl))
        sessions.append(Session((Turn((Segment("user", tokens),), osl),)))
        arrivals.append(t)


def tokens_to_text(tokens: tuple[int, ...] | list[int]) -> str:
    return " ".join(_WORDS[t % len(_WORDS)] for t in tokens)


def chat_messages(turn: Turn) -> list[dict[str, str]]:
    return [{"role": s.role, "content": tokens_to_text(s.tokens)} for s in turn.segments]
