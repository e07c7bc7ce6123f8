"""Result documents of `splitserve bench`: conditions (machine, git, server, workload) and their schema.

A run writes ``run.json`` (every condition, and each sweep point's results) and ``point-<i>.json`` per sweep
point (the same conditions plus that point's load and per-request rows), so any one file stands alone.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA = "splitserve.bench/v1"
REPO = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpus_available": cpus, "cpu_model": model or platform.processor(),
            "mem_gib": mem_gib, "hostname": platform.node(), "os": platform.platform(),
            "python": sys.version.split()[0], "loadavg": [round(x, 2) for x in os.getloadavg()]}


def git_info(repo: Path = REPO) -> dict[str, Any]:
    """Commit of the splitserve checkout this client runs from (read-only git calls, no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, env=env,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, env=env, timeout=10).stdout.splitlines()
        return {"commit": commit, "dirty": bool(dirty), "dirty_files": [d[3:] for d in dirty][:50]}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "dirty_files": []}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parse_conditions(text: str) -> dict[str, str]:
    """``"pd=1:1,transfer_backend=nixl"`` -> dict; values may hold ':' but not ','."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad condition {part!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


# ----------------------------------------------------------------------------------------- schema

_SUMMARY_KEYS = ("n", "mean", "p50", "p90", "p99", "min", "max")
_NUM = (int, float)
_OPT_NUM = (int, float, type(None))

CONDITION_KEYS: dict[str, tuple[type, ...]] = {
    "target_url": (str,), "endpoint": (str,), "model": (str,), "workload": (dict,), "mode": (str,),
    "num_requests": (int,), "max_duration_s": _NUM, "seed": (int,), "slo": (dict,), "user": (dict,),
    "pd_split": (str, type(None)), "block_size": (int, list, type(None)), "transfer_backend": (str,),
    "server": (dict,), "machine": (dict,), "git": (dict,), "client": (dict,), "timestamp": (str,),
}
RESULT_KEYS: dict[str, tuple[type, ...]] = {
    "num_requests": (int,), "num_ok": (int,), "num_errors": (int,), "error_kinds": (dict,), "duration_s": _NUM,
    "requests_per_s": _NUM, "output_tokens_per_s": _NUM, "total_tokens_per_s": _NUM,
    "goodput_requests_per_s": _OPT_NUM, "slo_attainment": _OPT_NUM, "output_tokens": (int,),
    "prompt_tokens": (int,), "cached_tokens": (int,), "cached_token_share": _OPT_NUM,
    "ttft_ms": (dict,), "itl_ms": (dict,), "tpot_ms": (dict,), "e2e_ms": (dict,),
}
LOAD_KEYS: dict[str, tuple[type, ...]] = {"mode": (str,), "concurrency": (int, type(None)),
                                          "rate": _OPT_NUM, "max_concurrency": (int, type(None))}


def _check(doc: dict, keys: dict[str, tuple[type, ...]], where: str, errors: list[str]) -> None:
    for key, types in keys.items():
        if key not in doc:
            errors.append(f"{where}.{key} missing")
        elif not isinstance(doc[key], types) or (isinstance(doc[key], bool) and bool not in types):
            errors.append(f"{where}.{key} is {type(doc[key]).__name__}, expected {'/'.join(t.__name__ for t in types)}")


def validate_point(doc: dict, where: str = "point") -> list[str]:
    errors: list[str] = []
    if not isinstance(doc, dict):
        return [f"{where} is not an object"]
    for key in ("index", "conditions", "load", "results", "server_metrics"):
        if key not in doc:
            errors.append(f"{where}.{key} missing")
    if errors:
        return errors
    _check(doc["conditions"], CONDITION_KEYS, f"{where}.conditions", errors)
    _check(doc["load"], LOAD_KEYS, f"{where}.load", errors)
    _check(doc["results"], RESULT_KEYS, f"{where}.results", errors)
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        summary = doc["results"].get(name)
        if isinstance(summary, dict):
            for k in _SUMMARY_KEYS:
                if k not in summary:
                    errors.append(f"{where}.results.{name}.{k} missing")
                elif not isinstance(summary[k], _OPT_NUM):
                    errors.append(f"{where}.results.{name}.{k} is not a number")
    for k in ("nproc", "cpu_model"):
        if k not in doc["conditions"].get("machine", {}):
            errors.append(f"{where}.conditions.machine.{k} missing")
    if "commit" not in doc["conditions"].get("git", {}):
        errors.append(f"{where}.conditions.git.commit missing")
    if "requests" in doc and not isinstance(doc["requests"], list):
        errors.append(f"{where}.requests is not a list")
    return errors


def validate(doc: dict) -> list[str]:
    """Schema problems of a run or point document (empty: valid)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return [f"not a {SCHEMA} document"]
    if doc.get("kind") == "point":
        return validate_point(doc)
    if doc.get("kind") != "run":
        return [f"unknown kind {doc.get('kind')!r}"]
    errors: list[str] = []
    for key, types in {"label": (str,), "conditions": (dict,), "sweep": (dict,), "points": (list,),
                       "command": (list,), "timestamp": (str,)}.items():
        if key not in doc:
            errors.append(f"run.{key} missing")
        elif not isinstance(doc[key], types):
            errors.append(f"run.{key} has the wrong type")
    if not errors:
        _check(doc["conditions"], CONDITION_KEYS, "run.conditions", errors)
        for i, point in enumerate(doc["points"]):
            errors += validate_point(point, f"run.points[{i}]")
    return errors
