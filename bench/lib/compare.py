"""`splitserve bench compare A.json B.json`: side-by-side numbers and B/A ratios, point by point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.lib.report import SCHEMA

# (row name, path into a point's results, whether higher is better)
ROWS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("ok / requests", ("num_ok",), True),
    ("errors", ("num_errors",), False),
    ("requests/s", ("requests_per_s",), True),
    ("output tokens/s", ("output_tokens_per_s",), True),
    ("goodput req/s", ("goodput_requests_per_s",), True),
    ("TTFT p50 ms", ("ttft_ms", "p50"), False),
    ("TTFT p90 ms", ("ttft_ms", "p90"), False),
    ("TTFT p99 ms", ("ttft_ms", "p99"), False),
    ("ITL p50 ms", ("itl_ms", "p50"), False),
    ("ITL p99 ms", ("itl_ms", "p99"), False),
    ("TPOT p50 ms", ("tpot_ms", "p50"), False),
    ("TPOT p99 ms", ("tpot_ms", "p99"), False),
    ("e2e p50 ms", ("e2e_ms", "p50"), False),
    ("e2e p99 ms", ("e2e_ms", "p99"), False),
    ("cached share", ("cached_token_share",), True),
)


def load_points(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(conditions, points) of a run.json or a point-<i>.json."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} document")
    if doc.get("kind") == "point":
        return doc["conditions"], [doc]
    return doc["conditions"], doc["points"]


def _get(d: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


_IGNORED = ("timestamp", "machine.loadavg", "server.health", "client.argv")


def condition_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    fa, fb = _flatten(a), _flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if any(key == p or key.startswith(p + ".") for p in _IGNORED):
            continue
        if fa.get(key) != fb.get(key):
            out.append((key, fa.get(key), fb.get(key)))
    return out


def _point_name(p: dict[str, Any]) -> str:
    load = p.get("load", {})
    if load.get("mode") == "closed":
        return f"concurrency {load.get('concurrency')}"
    if load.get("rate") is not None:
        return f"rate {load.get('rate')}/s"
    return f"point {p.get('index')}"


def _load_key(p: dict[str, Any]) -> tuple[Any, ...]:
    load = p.get("load", {})
    return (load.get("mode"), load.get("concurrency"), load.get("rate"))


def pair_points(pa: list[dict[str, Any]], pb: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Points with the same load (mode, concurrency, rate) when every A point has one in B, else by index."""
    by_key = {_load_key(p): p for p in pb}
    if len(by_key) == len(pb) and all(_load_key(p) in by_key for p in pa):
        return [(p, by_key[_load_key(p)]) for p in pa]
    return list(zip(pa, pb))


def compare(a_path: Path, b_path: Path) -> str:
    ca, pa = load_points(a_path)
    cb, pb = load_points(b_path)
    lines = [f"A: {a_path}  ({ca.get('user', {}).get('label') or ''} {ca.get('timestamp', '')})",
             f"B: {b_path}  ({cb.get('user', {}).get('label') or ''} {cb.get('timestamp', '')})"]
    diff = condition_diff(ca, cb)
    if diff:
        lines.append("conditions that differ:")
        for key, va, vb in diff[:40]:
            lines.append(f"  {key}: {_fmt(va)}  ->  {_fmt(vb)}")
        if len(diff) > 40:
            lines.append(f"  ... {len(diff) - 40} more")
    pairs = pair_points(pa, pb)
    if len(pairs) < max(len(pa), len(pb)):
        lines.append(f"note: A has {len(pa)} points, B has {len(pb)}; {len(pairs)} paired")
    for a, b in pairs:
        na, nb = _point_name(a), _point_name(b)
        lines.append("")
        lines.append(f"{na}" + (f"  vs  {nb}" if na != nb else ""))
        lines.append(f"  {'metric':18s} {'A':>12s} {'B':>12s} {'B/A':>8s}")
        for name, keys, _higher in ROWS:
            va, vb = _get(a["results"], keys), _get(b["results"], keys)
            ratio = "-"
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va:
                ratio = f"{vb / va:.3f}"
            lines.append(f"  {name:18s} {_fmt(va):>12s} {_fmt(vb):>12s} {ratio:>8s}")
        ha = a.get("server_metrics", {}).get("highlights") or {}
        hb = b.get("server_metrics", {}).get("highlights") or {}
        for key in sorted(set(ha) | set(hb)):
            va, vb = ha.get(key), hb.get(key)
            if va or vb:
                numeric = isinstance(va, (int, float)) and isinstance(vb, (int, float))
                ratio = f"{vb / va:.3f}" if numeric and va else "-"
                lines.append(f"  {'srv ' + key:18s} {_fmt(va):>12s} {_fmt(vb):>12s} {ratio:>8s}")
    return "\n".join(lines)
