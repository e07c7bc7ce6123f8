"""The report of bench/interference.py: what one configuration's phases measured, the summary over repeats, the goals.

Inter-token gaps follow bench/lib/metrics.py (a chunk of k tokens is one gap and k-1 zeros; the first token
has none); a gap belongs to the phase (window of perf_counter time) in which its later token arrived.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.kv_transfer import compare_to_raw, pulls_against_raw, pulls_between
from bench.lib.client import StreamResult
from bench.lib.metrics import percentile, summarize, token_times
from bench.lib.server import metric_deltas

GOAL_ITL_P99_RATIO = 1.25
GOAL_TRANSFER_FRACTION = 0.70
STALL_S = 0.25  # an inter-token gap this long counts as a stall
# Frontend counters a phase reports the growth of.
FRONTEND_KEYS = ("prefill_decisions", "prefill_fallbacks", "transfer_failures", "migrations", "_count", "_sum",
                 "output_tokens", "prompt_tokens")


def initiator_role(mode: str) -> str:
    """The worker whose NIXL telemetry records a transfer: the decode worker READs (pull), the prefill WRITEs."""
    return "prefill" if mode == "push" else "decode"


def dist_ms(values: list[float]) -> dict[str, Any]:
    # p99 alone can miss stalls: 10 long prompts stalling 4 streams each are <1% of ~5,000 gaps. Hence p99.9 and
    # the count and summed time of gaps over STALL_S.
    stalls = [v for v in values if v > STALL_S]
    p999 = percentile(values, 0.999)
    return {**summarize(values, 1e3, 2), "p999": None if p999 is None else round(p999 * 1e3, 2),
            f"n_over_{int(STALL_S * 1e3)}ms": len(stalls), f"s_over_{int(STALL_S * 1e3)}ms": round(sum(stalls), 3)}


def gaps_in(results: list[StreamResult], windows: list[tuple[float, float]]) -> tuple[list[float], int, int]:
    """Inter-token gaps (s) of the streams whose later token arrived in one of ``windows``; also the chunks
    and tokens (after the first) that arrived there."""
    gaps, chunks, tokens = [], 0, 0

    def inside(t: float) -> bool:
        return any(a <= t < b for a, b in windows)

    for r in results:
        timing = r.timing()
        times = [r.sent_s + t for t in token_times(timing.chunk_times_s, timing.chunk_tokens)]
        gaps += [b - a for a, b in zip(times, times[1:]) if inside(b)]
        for t, k in list(zip(timing.chunk_times_s, timing.chunk_tokens))[1:]:
            if inside(r.sent_s + t):
                chunks += 1
                tokens += k
    return gaps, chunks, tokens


def frontend_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    deltas = metric_deltas(before, after)["deltas"]
    return {k: v for k, v in deltas.items() if any(s in k for s in FRONTEND_KEYS)}


def worker_deltas(w0: dict[str, dict], w1: dict[str, dict], nixl_ref: dict | None) -> dict[str, dict]:
    """Per worker: transfers, bytes, seconds, GB/s and prefix hits between two WorkerStats (as dicts)."""
    out = {}
    for wid, st in w1.items():
        prev = w0.get(wid, {})
        nbytes = st["num_transfer_bytes"] - prev.get("num_transfer_bytes", 0)
        secs = st.get("transfer_seconds_total", 0.0) - prev.get("transfer_seconds_total", 0.0)
        out[wid] = {
            "role": st["role"], "transfers": st["num_transfers"] - prev.get("num_transfers", 0),
            "transfer_failures": st["num_transfer_failures"] - prev.get("num_transfer_failures", 0),
            "transfer_bytes": nbytes, "transfer_seconds": round(secs, 6),
            "transfer_descriptors": st.get("num_transfer_descriptors", 0) - prev.get("num_transfer_descriptors", 0),
            "transfer_gbps": round(nbytes / secs / 1e9, 3) if secs > 0 else None,
            "prefix_hits": st["num_prefix_hits"] - prev.get("num_prefix_hits", 0),
            "pulls": pulls_against_raw(pulls_between(prev, st), nixl_ref)}
    return out


def phase(steady: list[StreamResult], a: float, b: float, s0: dict, s1: dict, w0: dict, w1: dict,
          nixl_ref: dict | None) -> dict[str, Any]:
    """One phase [a, b): the steady streams' gaps, throughput, CPU of each process tree, counters, workers."""
    gaps, chunks, tokens = gaps_in(steady, [(a, b)])
    wall = s1["t"] - s0["t"]
    return {"window_s": round(b - a, 2), "steady_itl_ms": dist_ms(gaps),
            "steady_tokens_per_chunk": round(tokens / chunks, 4) if chunks else None,
            "steady_tokens_per_s": round(tokens / (b - a), 1),
            "cpu_utilisation": {k: round((s1["cpu"][k] - s0["cpu"].get(k, 0.0)) / wall, 3) for k in s1["cpu"]},
            "frontend_metrics_delta": frontend_delta(s0["metrics"], s1["metrics"]),
            "workers": worker_deltas(w0, w1, nixl_ref)}


def long_prompts(longs: list[StreamResult], steady: list[StreamResult]) -> tuple[dict, dict]:
    """The long prompts' own numbers, and the steady streams' gaps while a long prompt was before its first
    token (prefill: remote in P/D, local in aggregated) vs after it (P/D: KV pull + decode on the decode worker)."""
    ok = [r for r in longs if r.ok and r.chunk_times_s]
    timings = [r.timing() for r in ok]
    own = {
        "sent": len(longs), "ok": len(ok), "errors": sorted({r.error for r in longs if r.error})[:5],
        "prompt_tokens": sorted({r.prompt_tokens for r in ok if r.prompt_tokens}),
        "completion_tokens": sorted({r.completion_tokens for r in ok if r.completion_tokens is not None}),
        "ttft_ms": dist_ms([r.chunk_times_s[0] for r in ok]),
        # Sent to second token: P/D adds the KV transfer and the decode worker's first step to the TTFT.
        "second_token_ms": dist_ms([r.chunk_times_s[1] for r in ok if len(r.chunk_times_s) > 1]),
        "e2e_ms": dist_ms([r.e2e_s for r in ok]),
        "own_itl_ms": dist_ms([g for t in timings for g in t.itl_s()]),
    }
    prefill_w = [(r.sent_s, r.sent_s + r.chunk_times_s[0]) for r in ok]
    after_w = [(r.sent_s + r.chunk_times_s[0], r.end_s) for r in ok]
    by_phase = {"during_long_prefill": dist_ms(gaps_in(steady, prefill_w)[0]),
                "during_long_decode": dist_ms(gaps_in(steady, after_w)[0])}
    return own, by_phase


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def ratios(out: dict[str, Any]) -> dict[str, float | None]:
    base, inter = out["baseline"]["steady_itl_ms"], out["interference"]["steady_itl_ms"]
    return {"itl_p99_interference_over_baseline": _ratio(inter["p99"], base["p99"]),
            "itl_p50_interference_over_baseline": _ratio(inter["p50"], base["p50"])}


def transfer(out: dict[str, Any]) -> dict[str, Any] | None:
    """The initiator's transfers in the interference phase (decode READs; push: prefill WRITEs), per transfer
    and against the raw READ under load."""
    role = initiator_role(out.get("kv_transfer", "pull"))
    dec = [w for w in out["interference"]["workers"].values() if w["role"] == role]
    if not dec or not dec[0]["transfer_gbps"]:
        return None
    d = dec[0]
    n = max(1, d["transfers"])
    pulls = d["pulls"]
    if "nixl_read_under_load" in out and "gbps_median" in pulls:
        pulls["vs_raw_under_load"] = compare_to_raw(pulls["gbps_median"], pulls["descriptors_median"],
                                                    out["nixl_read_under_load"])
    return {**d, "bytes_per_transfer": d["transfer_bytes"] // n,
            "seconds_per_transfer_ms": round(d["transfer_seconds"] / n * 1e3, 3),
            "descriptors_per_transfer": round(d["transfer_descriptors"] / n, 1)}


def _at(doc: dict, path: tuple[str, ...]) -> Any:
    for p in path:
        doc = doc.get(p) if isinstance(doc, dict) else None
    return doc


def summarize_runs(runs: list[dict]) -> dict:
    """Per configuration: medians over its repeats (and, for P/D, each repeat's pull figures)."""
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    summary = {}
    for config, rs in by.items():
        def each(*path: str) -> list:
            return [_at(r, path) for r in rs]

        def med(*path: str) -> float | None:
            vals = [v for v in each(*path) if v is not None]
            return round(statistics.median(vals), 3) if vals else None

        summary[config] = {
            "repeats": len(rs),
            "kv_transfer": rs[0].get("kv_transfer", "pull") if config.startswith("pd") else None,
            "baseline_itl_p50_ms": med("baseline", "steady_itl_ms", "p50"),
            "baseline_itl_p99_ms": med("baseline", "steady_itl_ms", "p99"),
            "interference_itl_p50_ms": med("interference", "steady_itl_ms", "p50"),
            "interference_itl_p99_ms": med("interference", "steady_itl_ms", "p99"),
            "itl_p99_ratio_median": med("ratios", "itl_p99_interference_over_baseline"),
            "itl_p99_ratio_each": each("ratios", "itl_p99_interference_over_baseline"),
            "long_ttft_p50_ms": med("long_prompts", "ttft_ms", "p50"),
            "long_ttft_p99_ms": med("long_prompts", "ttft_ms", "p99"),
            "long_second_token_p50_ms": med("long_prompts", "second_token_ms", "p50"),
            "long_second_token_p99_ms": med("long_prompts", "second_token_ms", "p99"),
            "during_long_decode_itl_p99_ms": med("interference", "steady_itl_by_long_phase_ms", "during_long_decode",
                                                 "p99"),
        }
        if config.startswith("pd"):
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


def goals(summary: dict) -> dict[str, Any]:
    out: dict[str, Any] = {"pd_itl_p99_ratio_max": GOAL_ITL_P99_RATIO, "transfer_fraction_min": GOAL_TRANSFER_FRACTION}
    if "pd" in summary and summary["pd"]["itl_p99_ratio_median"] is not None:
        out["pd_itl_p99_ratio_met"] = summary["pd"]["itl_p99_ratio_median"] <= GOAL_ITL_P99_RATIO
        tr = summary["pd"]["transfer"]

        def median_met(key: str) -> bool:
            vals = [f for f in tr[key] if f is not None]
            return bool(vals) and statistics.median(vals) >= GOAL_TRANSFER_FRACTION

        out["transfer_fraction_idle_met"] = median_met("idle_fraction_of_raw_idle_each")
        out["transfer_fraction_under_load_met"] = median_met("loaded_fraction_of_raw_under_load_each")
        out["transfer_fraction_loaded_vs_idle_raw_met"] = median_met("loaded_fraction_of_raw_idle_each")
    if "pd-pull" in summary and "pd-push" in summary:
        pull, push = summary["pd-pull"], summary["pd-push"]
        out["push_over_pull"] = {key: _ratio(push[key], pull[key]) for key in (
            "interference_itl_p99_ms", "itl_p99_ratio_median", "during_long_decode_itl_p99_ms", "long_ttft_p50_ms",
            "long_ttft_p99_ms", "long_second_token_p50_ms", "long_second_token_p99_ms")}
    if "agg" in summary and "pd" in summary:
        out["agg_over_pd_interference_itl_p99"] = _ratio(summary["agg"]["interference_itl_p99_ms"],
                                                         summary["pd"]["interference_itl_p99_ms"])
    return out


def progress_line(r: dict) -> str:
    b, x = r["baseline"]["steady_itl_ms"], r["interference"]["steady_itl_ms"]
    return (f"  start {r['graph_start_s']} s; ITL p50/p99 baseline {b['p50']}/{b['p99']} ms, with long prompts "
            f"{x['p50']}/{x['p99']} ms (p99 x{r['ratios']['itl_p99_interference_over_baseline']}); long TTFT "
            f"p50 {r['long_prompts']['ttft_ms']['p50']} ms ({r['long_prompts']['ok']}/{r['long_prompts']['sent']} "
            f"ok); pulls: idle {r.get('idle_pulls', {}).get('pulls', {}).get('ms_median')} ms, loaded "
            f"{r.get('transfer', {}).get('pulls', {}).get('ms_median')} ms (median); {r['elapsed_s']} s, load "
            f"{r['loadavg_after']}")
