"""`up`'s Prometheus file-SD target list: one scrape target per service process it runs.

The targets come from the child commands themselves (a service's `--metrics-port`; the frontend's /metrics on
its HTTP `--port`), so a restarted child, which reruns its command, keeps its target and its series. Prometheus
re-reads the file when it changes (file_sd_configs); it is replaced by rename, so a scrape never reads half a file.

Default place: ``<tmp>/splitserve-<uid>/targets-<frontend port>.json``. Not the working directory: `up` runs from
anywhere (a read-only checkout, a home directory) and two graphs started there would share one file. The frontend's
port is unique per host among running graphs, so names never collide, and one Prometheus glob
(``/tmp/splitserve-<uid>/targets-*.json``) covers every local graph. A clean stop removes the file (a stopped graph
is no outage); a killed launcher leaves it, and its targets then show as down.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Services with their own Prometheus port (`--metrics-port`); the frontend serves /metrics on its HTTP port and
# the planner has no metrics.
_METRICS_PORT_SERVICES = ("router", "worker", "kvtier")
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class MetricsTarget:
    service: str  # router | worker | kvtier | frontend
    address: str  # host:port to scrape
    role: str = ""  # workers: prefill | decode | both
    worker_id: str = ""


def default_sd_path(frontend_port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"splitserve-{os.getuid()}" / f"targets-{frontend_port}.json"


def serves_own_metrics_port(service: str) -> bool:
    return service in _METRICS_PORT_SERVICES


def _arg(cmd: Sequence[str], flag: str, default: str = "") -> str:
    return cmd[cmd.index(flag) + 1] if flag in cmd else default


def scrape_address(host: str, port: int) -> str:
    """Where a local Prometheus reaches a service bound to ``host`` (a wildcard bind is reached on loopback)."""
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def metrics_target(cmd: Sequence[str]) -> MetricsTarget | None:
    """The scrape target of one child command (`service --flag value ...`), or None if it serves no metrics."""
    service = cmd[0]
    if service == "frontend" and "--metrics-port" in cmd:  # one of several sharing the HTTP port
        return MetricsTarget("frontend", scrape_address("127.0.0.1", int(_arg(cmd, "--metrics-port"))))
    if service == "frontend":
        return MetricsTarget("frontend", scrape_address(_arg(cmd, "--host", "127.0.0.1"), int(_arg(cmd, "--port"))))
    port = int(_arg(cmd, "--metrics-port", "0"))
    if not serves_own_metrics_port(service) or port == 0:
        return None
    # Services bind their metrics port on loopback (their default).
    return MetricsTarget(service, scrape_address("127.0.0.1", port), _arg(cmd, "--role"), _arg(cmd, "--worker-id"))


def sd_groups(targets: Sequence[MetricsTarget]) -> list[dict[str, object]]:
    """Prometheus file-SD JSON: one group per target, so each carries its own labels."""
    groups: list[dict[str, object]] = []
    for t in targets:
        labels = {"job": f"splitserve-{t.service}", "service": t.service}
        if t.role:
            labels["role"] = t.role
        if t.worker_id:
            labels["worker_id"] = t.worker_id
        groups.append({"targets": [t.address], "labels": labels})
    return groups


def write_sd_file(path: Path, targets: Sequence[MetricsTarget]) -> None:
    """Replace ``path`` atomically (write a temp file beside it, then rename over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(sd_groups(targets), indent=1) + "\n")
    os.replace(tmp, path)
