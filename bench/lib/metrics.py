"""Latency and throughput math for `splitserve bench`: pure functions over timings, no I/O.

Definitions (every time in seconds, relative to the moment the request's last byte was written):

- **TTFT**: arrival of the first SSE event that carries output (a non-empty text/content delta).
- **Token arrival times**: a stream is a list of chunks ``(arrival_s, num_tokens)``. A chunk that carries k
  tokens counts as k tokens that all arrived at that chunk's time: its first token's gap is the time since the
  previous chunk, its other k-1 tokens have gaps of 0. So a request with n output tokens has exactly n-1
  inter-token gaps, and they sum to ``last_token_s - ttft_s``.
- **ITL**: those per-token gaps. Aggregate ITL percentiles pool the gaps of every request.
- **TPOT**: ``(e2e - ttft) / (n - 1)`` per request (undefined for n < 2), where e2e runs to the end of the
  stream (``[DONE]``), not to the last token.
- **e2e**: end of the response (the stream's terminator) minus send.
- **Percentiles**: linear interpolation between closest ranks (numpy's default): for sorted values v of
  length n, p(q) = v[i] + (v[i+1] - v[i]) * f, where i + f = q * (n - 1).
- **Throughput**: ``requests/s = ok requests / duration``, ``output tokens/s = output tokens of ok requests /
  duration``, duration = first send to last response end of the measured run.
- **Goodput**: requests that succeeded *and* met every SLO, per second of the same duration. SLO keys:
  ``ttft_ms`` (the request's TTFT), ``tpot_ms`` (its TPOT), ``itl_ms`` (its *largest* inter-token gap: no
  stall above the bound), ``e2e_ms``. A request without a value for a key (TPOT of a 1-token answer, ITL of a
  1-token answer) meets that key.
- **Cached-token share**: sum of ``usage.prompt_tokens_details.cached_tokens`` over sum of
  ``usage.prompt_tokens``, over the requests that reported usage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 1]; None for no values."""
    if not values:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], not {q}")
    v = sorted(values)
    pos = q * (len(v) - 1)
    i = int(math.floor(pos))
    if i >= len(v) - 1:
        return float(v[-1])
    frac = pos - i
    return float(v[i] + (v[i + 1] - v[i]) * frac)


def summarize(values: Sequence[float], scale: float = 1.0, ndigits: int = 4) -> dict[str, Any]:
    """{n, mean, p50, p90, p99, min, max} of ``values`` times ``scale`` (1e3 turns seconds into ms)."""
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}

    def r(x: float | None) -> float | None:
        return None if x is None else round(x * scale, ndigits)

    return {"n": len(values), "mean": r(sum(values) / len(values)), "p50": r(percentile(values, 0.5)),
            "p90": r(percentile(values, 0.9)), "p99": r(percentile(values, 0.99)), "min": r(min(values)),
            "max": r(max(values))}


def attribute_tokens(chunk_tokens: Sequence[int], completion_tokens: int | None) -> list[int]:
    """Tokens per chunk, reconciled with the server's final ``usage.completion_tokens``.

    Without per-chunk counts from the server each text chunk is taken as one token. Tokens the usage reports
    beyond what the chunks account for (a detokenizer that held text back, tokens that decode to nothing) are
    taken to have arrived with the last chunk. Chunks that account for more tokens than the usage reports
    are kept as they are (the token count of the request is then the usage's).
    """
    out = list(chunk_tokens)
    if completion_tokens is not None and out and sum(out) < completion_tokens:
        out[-1] += completion_tokens - sum(out)
    return out


def token_times(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Arrival time of each output token: a chunk of k tokens contributes k equal times."""
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError("chunk_times and chunk_tokens differ in length")
    out: list[float] = []
    for t, k in zip(chunk_times, chunk_tokens):
        out.extend([t] * k)
    return out


def itl_gaps(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Per-token gaps: n tokens give n-1 gaps; tokens within one chunk have gap 0."""
    times = token_times(chunk_times, chunk_tokens)
    return [b - a for a, b in zip(times, times[1:])]


def tpot(e2e_s: float, ttft_s: float, num_tokens: int) -> float | None:
    """Time per output token after the first: (e2e - ttft) / (n - 1); None for n < 2."""
    if num_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (num_tokens - 1)


@dataclass
class RequestTiming:
    """One finished request, times relative to its send. ``chunk_times_s``/``chunk_tokens`` cover the chunks
    that carried output (already reconciled with the usage, see ``attribute_tokens``)."""

    ok: bool
    e2e_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str = ""

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def num_output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else sum(self.chunk_tokens)

    def itl_s(self) -> list[float]:
        return itl_gaps(self.chunk_times_s, self.chunk_tokens)

    def tpot_s(self) -> float | None:
        ttft = self.ttft_s
        return None if ttft is None else tpot(self.e2e_s, ttft, self.num_output_tokens)


def request_values_ms(req: RequestTiming) -> dict[str, float | None]:
    """The per-request values the SLO keys compare, in ms."""
    gaps = req.itl_s()
    ttft, tp = req.ttft_s, req.tpot_s()
    return {"ttft_ms": None if ttft is None else ttft * 1e3, "tpot_ms": None if tp is None else tp * 1e3,
            "itl_ms": max(gaps) * 1e3 if gaps else None, "e2e_ms": req.e2e_s * 1e3}


def meets_slo(req: RequestTiming, slo: dict[str, float]) -> bool:
    """Succeeded, and every SLO key's value (see ``request_values_ms``) is at or under its bound."""
    if not req.ok:
        return False
    unknown = set(slo) - set(SLO_KEYS)
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}; known: {', '.join(SLO_KEYS)}")
    values = request_values_ms(req)
    return all(values[k] is None or values[k] <= bound for k, bound in slo.items())


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft_ms=200,itl_ms=50"`` -> {"ttft_ms": 200.0, "itl_ms": 50.0}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in SLO_KEYS:
            raise ValueError(f"bad SLO {part!r}: expected KEY=MS with KEY in {', '.join(SLO_KEYS)}")
        out[key.strip()] = float(value)
    return out


def cached_share(requests: Iterable[RequestTiming]) -> float | None:
    prompt = cached = 0
    for r in requests:
        if r.ok and r.prompt_tokens is not None:
            prompt += r.prompt_tokens
            cached += r.cached_tokens or 0
    return cached / prompt if prompt else None


def aggregate(requests: Sequence[RequestTiming], duration_s: float, slo: dict[str, float] | None = None,
              ndigits: int = 4) -> dict[str, Any]:
    """The run's numbers: counts, throughput, goodput, latency summaries (ms), cached share."""
    ok = [r for r in requests if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in r.itl_s()]
    tpots = [t for t in (r.tpot_s() for r in ok) if t is not None]
    e2e = [r.e2e_s for r in ok]
    out_tokens = sum(r.num_output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    per_s = (lambda x: round(x / duration_s, ndigits)) if duration_s > 0 else (lambda x: 0.0)
    errors: dict[str, int] = {}
    for r in requests:
        if not r.ok:
            kind = (r.error or "error").split(":")[0][:80]
            errors[kind] = errors.get(kind, 0) + 1
    share = cached_share(ok)
    return {
        "num_requests": len(requests), "num_ok": len(ok), "num_errors": len(requests) - len(ok),
        "error_kinds": errors, "duration_s": round(duration_s, ndigits),
        "requests_per_s": per_s(len(ok)), "output_tokens_per_s": per_s(out_tokens),
        "total_tokens_per_s": per_s(out_tokens + prompt_tokens),
        "goodput_requests_per_s": per_s(sum(meets_slo(r, slo) for r in ok)) if slo else None,
        "slo_attainment": round(sum(meets_slo(r, slo) for r in requests) / len(requests), ndigits)
        if slo and requests else None,
        "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "cached_token_share": None if share is None else round(share, ndigits),
        "ttft_ms": summarize(ttft, 1e3, ndigits), "itl_ms": summarize(itl, 1e3, ndigits),
        "tpot_ms": summarize(tpots, 1e3, ndigits), "e2e_ms": summarize(e2e, 1e3, ndigits),
    }
