"""The plan as a table for a terminal (``splitserve plan`` without ``--json``)."""

from __future__ import annotations

from services.planner.results import Plan


def format_plan(p: Plan) -> str:
    def f(x: float | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    d, a, dec = p.disaggregated, p.aggregated, p.decision
    lines = [f"workload: rate {p.rate:.3g} req/s, ISL {p.isl_mean:.0f}, OSL {p.osl_mean:.0f}, "
             f"mean context {p.context_mean:.0f}; SLO TTFT {p.slo.ttft_ms:g} ms, ITL {p.slo.itl_ms:g} ms", ""]
    rows = [("", "disaggregated", "aggregated")]
    if d.feasible and d.prefill and d.decode:
        dw = f"{d.prefill.workers}P + {d.decode.workers}D = {d.total_workers}"
    else:
        dw = f"infeasible ({d.infeasible_reason})"
    aw = f"{a.workers}" if a.feasible else f"infeasible ({a.infeasible_reason})"
    rows.append(("workers", dw, aw))
    rows.append(("TTFT ms", f(d.ttft_ms), f(a.ttft_ms)))
    rows.append(("ITL ms", f(d.itl_ms), f(a.itl_ms) + (f" (max {f(a.itl_max_ms)})" if a.feasible else "")))
    rows.append(("decode batch/worker", f(d.decode.batch if d.decode else None, ".2f"), f(a.batch, ".2f")))
    rows.append(("goodput req/s/worker", f(d.goodput_rps_per_worker, ".3g"), f(a.goodput_rps_per_worker, ".3g")))
    rows.append(("output tok/s/worker", f(d.output_tokens_per_s_per_worker, ".4g"),
                 f(a.output_tokens_per_s_per_worker, ".4g")))
    if d.prefill:
        rows.append(("prefill util / cap", f"{d.prefill.utilization:.2f} / "
                     f"{f(d.prefill.max_rate_per_worker, '.3g')} req/s", f(a.prefill_utilization, ".2f")))
    if d.decode:
        rows.append(("decode b* / step ms", f"{d.decode.max_batch_within_itl} / {f(d.decode.step_ms_at_max_batch)}",
                     ""))
    rows.append(("local prefill <= tokens", str(d.local_prefill_max_tokens), "all"))
    if d.kv_transfer_ms is not None:
        rows.append(("KV transfer ms", f(d.kv_transfer_ms, ".2f"), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += ["", f"recommendation: {dec.mode} ({', '.join(dec.reasons)})"]
    if a.feasible and a.bound_by:
        lines.append(f"aggregated is bound by: {', '.join(a.bound_by)}")
    return "\n".join(lines)
