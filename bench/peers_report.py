"""bench/peers.py's summary and plot: each arm's figures per rate (every run of it), and ratios within pairs.

A pair is the k-th run of arm A and the k-th run of arm B (the order interleaves them: A B A B), so both saw the
machine at about the same time; every goal is checked pair by pair, not on averages across the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIELDS = {"goodput_rps": ("goodput_requests_per_s",), "rps": ("requests_per_s",),
          "ttft_p50_ms": ("ttft_ms", "p50"), "ttft_p99_ms": ("ttft_ms", "p99"), "itl_p50_ms": ("itl_ms", "p50"),
          "itl_p99_ms": ("itl_ms", "p99"), "tpot_p50_ms": ("tpot_ms", "p50"), "tpot_p90_ms": ("tpot_ms", "p90"),
          "slo_attainment": ("slo_attainment",)}
# The baselines the goals compare every splitserve arm (``ss-*``) with, and vLLM's P/D with itself shipped.
BASELINES = ("vllm-pd", "vllm-agg")


def pairs_of(arms: list[str]) -> list[tuple[str, str]]:
    """(candidate, baseline) for every splitserve arm and baseline of a run, in the run's order."""
    pairs = [(cand, base) for cand in arms if cand.startswith("ss-") for base in BASELINES if base in arms]
    return pairs + ([("vllm-pd", "vllm-pd-shipped")] if {"vllm-pd", "vllm-pd-shipped"} <= set(arms) else [])


def _get(results: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = results
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def point_figures(point: dict[str, Any]) -> dict[str, Any]:
    out = {name: _get(point["results"], path) for name, path in FIELDS.items()}
    cpu = point.get("cpu_ms_per_request") or {}
    out["server_cpu_ms_per_request"] = round(sum(v for k, v in cpu.items()), 1)
    if point.get("goodput_by_slo"):
        out["goodput_by_slo"] = point["goodput_by_slo"]
    return out


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_arm: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        for point in run.get("points", []):
            by_arm.setdefault(run["arm"], {}).setdefault(f"{point['rate']:g}", []).append(
                {"index": run["index"], "profiled": point.get("profiled", False), **point_figures(point)})
    pairs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for cand, base in pairs_of(list(by_arm)):
        for rate, cand_points in by_arm[cand].items():
            for a, b in zip(cand_points, by_arm[base].get(rate, [])):
                pairs.setdefault(f"{cand}/{base}", {}).setdefault(rate, []).append(
                    {"indices": [a["index"], b["index"]],
                     **{f"{k}_ratio": _ratio(a[k], b[k]) for k in ("goodput_rps", "tpot_p50_ms", "tpot_p90_ms",
                                                                   "itl_p99_ms", "ttft_p50_ms",
                                                                   "server_cpu_ms_per_request")},
                     **({"goodput_by_slo_ratio": {slo: _ratio(g, b.get("goodput_by_slo", {}).get(slo))
                                                  for slo, g in a["goodput_by_slo"].items()}}
                        if a.get("goodput_by_slo") else {})})
    return {"by_arm": by_arm, "pairs": pairs}


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display); None where matplotlib is not installed (a bench
    dependency: the run then writes its JSON without a plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """goodput, TPOT p90 and ITL p99 against offered rate, one marker per run of each arm; None without
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    by_arm = doc.get("summary", {}).get("by_arm", {})
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=90)
    for ax, key, label in ((axes[0], "goodput_rps", "goodput (req/s, SLO met)"), (axes[1], "tpot_p90_ms",
                           "TPOT p90 (ms)"), (axes[2], "itl_p99_ms", "ITL p99 (ms)")):
        for arm, rates in sorted(by_arm.items()):
            xs = [float(rate) for rate, points in rates.items() for p in points if p[key] is not None]
            ys = [p[key] for rate, points in rates.items() for p in points if p[key] is not None]
            ax.plot(xs, ys, "o", label=arm, alpha=0.8)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    cond = doc["conditions"]
    fig.suptitle(f"{cond['model']} {cond['dtype']}, {workload_label(cond['workload'])}, SLO {cond['slo']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path.name


def workload_label(workload: dict[str, Any]) -> str:
    """A plot title's words for a workload's description (bench/lib/workloads.py ``describe``): its kind and
    lengths, whichever the kind has."""
    def spec(value: Any) -> str:
        return value.get("spec", str(value)) if isinstance(value, dict) else str(value)

    parts = [workload.get("kind", "sharegpt-like")]
    for key, name in (("isl", "ISL"), ("long_isl", "long ISL"), ("long_fraction", "long share"),
                      ("num_prefixes", "prefixes"), ("prefix_len", "prefix"), ("suffix_len", "suffix"),
                      ("turns", "turns"), ("osl", "OSL")):
        if key in workload:
            parts.append(f"{name} {spec(workload[key])}")
    return ", ".join(parts)


def pyspy_summary(path: Path, top: int = 12) -> dict[str, Any]:
    """One process's py-spy ``--format raw`` file (collapsed stacks, ``frame;frame;... count``): its samples and
    the functions holding the most of them, by self time (the innermost frame) and inclusive time (anywhere
    on the stack), as shares of the samples. Line numbers are dropped, so a function is one row."""
    self_n: dict[str, int] = {}
    incl_n: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";")[1:]]  # the first is the thread
        if frames:
            self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for name in set(frames):
            incl_n[name] = incl_n.get(name, 0) + n

    def shares(counts: dict[str, int]) -> list[list[Any]]:
        return [[name, round(n / total, 3)] for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self": shares(self_n) if total else [], "inclusive": shares(incl_n) if total else []}


def _frame_name(frame: str) -> str:
    """``fn (path/to/file.py:123)`` -> ``fn (file.py)``."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file else name
