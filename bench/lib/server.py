"""What `splitserve bench` learns from the server: target checks, models, worker layout, Prometheus deltas."""

from __future__ import annotations

import ipaddress
import json
import math
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.lib.client import get as http_get


@dataclass(frozen=True)
class Target:
    url: str  # base, without a trailing slash and without /v1
    scheme: str
    host: str
    port: int
    api_key: str = ""

    @classmethod
    def parse(cls, url: str, api_key: str = "") -> Target:
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bad URL {url!r}: expected http://HOST:PORT")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[:-3]
        base = f"{parts.scheme}://{parts.hostname if ':' not in parts.hostname else '[' + parts.hostname + ']'}" \
               f":{port}{path}"
        return cls(base, parts.scheme, parts.hostname, port, api_key)

    @property
    def path_prefix(self) -> str:
        return urlsplit(self.url).path


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def get(target: Target, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET ``path`` on the server; (status, body), status 0 when it could not be reached."""
    return http_get(target.url + path, target.api_key, timeout_s)


def get_json(target: Target, path: str) -> Any:
    status, body = get(target, path)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def server_models(target: Target) -> list[str]:
    doc = get_json(target, "/v1/models")
    if not isinstance(doc, dict):
        return []
    return [m.get("id") for m in doc.get("data") or [] if isinstance(m, dict) and m.get("id")]


def server_facts(target: Target) -> dict[str, Any]:
    """What the server tells about itself: /health worker counts, /dashboard/data workers (splitserve only)."""
    health = get_json(target, "/health")
    dash = get_json(target, "/dashboard/data")
    workers = []
    if isinstance(dash, dict):
        for w in dash.get("workers") or []:
            workers.append({k: w.get(k) for k in ("worker_id", "role", "engine", "block_size", "kv_total_blocks")
                            if k in w})
    roles: dict[str, int] = {}
    for w in workers:
        roles[str(w.get("role"))] = roles.get(str(w.get("role")), 0) + 1
    if not roles and isinstance(health, dict) and "num_prefill_workers" in health:
        prefill = health.get("num_prefill_workers", 0)
        roles = {"prefill": prefill, "decode_or_both": health.get("num_decode_workers", 0)}
    block_sizes = sorted({w["block_size"] for w in workers if w.get("block_size") is not None})
    engines = sorted({str(w["engine"]) for w in workers if w.get("engine")})
    pd = None
    if roles:
        num_p, num_d = roles.get("prefill", 0), roles.get("decode", roles.get("decode_or_both", 0))
        parts = [f"{num_p}P:{num_d}D"] if num_p or num_d else []
        if roles.get("both"):
            parts.append(f"{roles['both']} aggregated")
        pd = " + ".join(parts)
    return {"health": health if isinstance(health, dict) else None, "workers": workers, "workers_by_role": roles,
            "pd_split": pd, "block_size": block_sizes[0] if len(block_sizes) == 1 else (block_sizes or None),
            "engines": engines or None, "has_dashboard": isinstance(dash, dict)}


# ----------------------------------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {'name{a="x",b="y"}': value} (labels sorted; no braces without labels)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        key = name
        if labels:
            pairs = sorted(_LABEL.findall(labels))
            if pairs:
                key += "{" + ",".join(f'{k}="{val}"' for k, val in pairs) + "}"
        out[key] = v
    return out


def scrape(target: Target | str) -> dict[str, float] | None:
    """The /metrics of a server (a ``Target``, or a bare metrics URL), parsed; None when it could not be read."""
    status, body = get(target, "/metrics") if isinstance(target, Target) else http_get(target)
    if status != 200:
        return None
    return parse_prometheus(body.decode(errors="replace"))


# The splitserve frontend counters worth a name in the report.
HIGHLIGHTS = {
    "prefill_remote": 'splitserve_frontend_prefill_decisions_total{where="remote"}',
    "prefill_local": 'splitserve_frontend_prefill_decisions_total{where="local"}',
    "prefill_fallbacks": "splitserve_frontend_prefill_fallbacks_total",
    "kv_transfer_failures": "splitserve_frontend_kv_transfer_failures_total",
    "migrations": "splitserve_frontend_migrations_total",
    "cached_prompt_tokens": "splitserve_frontend_cached_prompt_tokens_total",
    "prompt_tokens": "splitserve_frontend_prompt_tokens_total",
    "output_tokens": "splitserve_frontend_output_tokens_total",
    "cancelled_requests": "splitserve_frontend_cancelled_requests_total",
}


def metric_deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """Counter growth between two scrapes: every changed ``*_total``/``*_count``/``*_sum`` sample, plus the
    splitserve highlights (0 when the counter exists but did not move; None when the server lacks it)."""
    if before is None or after is None:
        return {"scraped": False, "highlights": {}, "deltas": {}}
    deltas: dict[str, float] = {}
    for key, value in after.items():
        name = key.split("{", 1)[0]
        if not name.endswith(("_total", "_count", "_sum")) or math.isnan(value):
            continue
        d = value - before.get(key, 0.0)
        if d:
            deltas[key] = round(d, 6)
    highlights: dict[str, float | None] = {}
    for short, key in HIGHLIGHTS.items():
        if key in after:
            highlights[short] = deltas.get(key, 0.0)
        else:
            highlights[short] = 0.0 if key.split("{")[0] + "_total" in after or any(
                k.startswith(key.split("{")[0]) for k in after) else None
    return {"scraped": True, "highlights": highlights, "deltas": dict(sorted(deltas.items()))}
