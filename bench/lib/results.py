"""Set-up every issue benchmark shares: its model, its conditions, its result file.

Each benchmark script is its workload and its report; what it ran under comes from here, the same way for all:
``conditions("routing", model=..., ...)`` adds the machine (bench/lib/machine.py: CPU, flags, memory, load,
git commit), the time and the command line; ``write_result`` writes the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.lib.machine import REPO, loadavg, machine
from bench.lib.report import now_iso
from common.tiny_model import make_tiny_model

RESULTS = REPO / "bench" / "results"
MODEL_100M = REPO / "models" / "tiny-100m"


def require_model(path: Path, size: str = "100m") -> dict[str, Any]:
    """The model's config.json; exits with the command that makes it when there is none."""
    if not (path / "config.json").exists():
        raise SystemExit(f"{path}: no model (python -m cli.main model make-tiny --size {size} --out {path})")
    return json.loads((path / "config.json").read_text())


def ensure_tiny_model(path: Path) -> Path:
    """The embedded tiny model at ``path``, made there if missing (deterministic)."""
    if not (path / "config.json").exists():
        make_tiny_model(path)
    return path


def conditions(bench: str, **fields: Any) -> dict[str, Any]:
    """What a run ran under: ``fields`` (workload, graph, engine, ...) plus machine, time and command line."""
    return {"bench": bench, **fields, "machine": machine(), "timestamp": now_iso(),
            "command": " ".join(["python", *sys.argv])}


def finish(doc_conditions: dict[str, Any]) -> None:
    """Stamps the end of a run on its conditions (the load average moved while it ran)."""
    doc_conditions["finished"] = now_iso()
    doc_conditions["machine"]["loadavg_after"] = loadavg()


def write_result(path: Path, doc: dict[str, Any], indent: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    return path
