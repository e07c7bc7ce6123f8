"""PNG plots of a bench run (matplotlib, Agg backend: no display needed).

- ``sweep.png``: latency against throughput, one marker per sweep point (labelled with its concurrency or
  rate): TTFT p50/p99 and ITL p50/p99 against output tokens/s. Read it as a knee curve: going right is more
  throughput; where the curves turn up steeply the server is saturated.
- ``latency.png``: TTFT and ITL distributions per sweep point, as histograms (top) and CDFs (bottom).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _point_label(point: dict[str, Any]) -> str:
    load = point["load"]
    if load["mode"] == "closed":
        return f"c={load['concurrency']}"
    if load.get("rate") is not None:
        return f"{load['rate']:g}/s"
    return "trace"


def sweep_plot(points: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=90)
    x = [p["results"]["output_tokens_per_s"] for p in points]
    for ax, metric, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            y = [p["results"][metric][q] for p in points]
            pairs = [(a, b) for a, b in zip(x, y) if b is not None]
            if pairs:
                ax.plot([a for a, _ in pairs], [b for _, b in pairs], style, label=f"{name} {q}")
        for p, xi in zip(points, x):
            yi = p["results"][metric]["p50"]
            if yi is not None:
                ax.annotate(_point_label(p), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "latency vs throughput", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _cdf(ax, values: Sequence[float], label: str) -> None:
    v = sorted(values)
    if v:
        ax.step(v, [(i + 1) / len(v) for i in range(len(v))], where="post", label=label)


def latency_plot(series: Sequence[tuple[str, Sequence[float], Sequence[float]]], path: Path,
                 title: str = "") -> Path:
    """``series``: (label, TTFT values ms, ITL values ms) per sweep point."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), dpi=90)
    for label, ttft, itl in series:
        for col, values in ((0, ttft), (1, itl)):
            if values:
                # Histograms stop at the 99.5th percentile so one outlier does not squash the rest (CDFs show all).
                lo, hi = min(values), sorted(values)[min(len(values) - 1, int(0.995 * len(values)))]
                axes[0][col].hist(values, bins=40, range=(lo, max(hi, lo + 1e-6)), histtype="step", label=label)
                _cdf(axes[1][col], values, label)
    for col, name in ((0, "TTFT"), (1, "ITL")):
        axes[0][col].set_title(f"{name} histogram (to p99.5)", fontsize=9)
        axes[0][col].set_ylabel("count")
        axes[1][col].set_title(f"{name} CDF", fontsize=9)
        axes[1][col].set_ylabel("fraction")
        for row in (0, 1):
            axes[row][col].set_xlabel(f"{name} (ms)")
            axes[row][col].grid(True, alpha=0.3)
            if series:
                axes[row][col].legend(fontsize=7)
    fig.suptitle(title or "latency distributions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
