"""Result documents of `splitserve bench`: conditions (machine, git, server, workload) and their schema.

A run writes ``run.json`` (every condition, and each sweep point's results) and ``point-<i>.json`` per sweep
point (the same conditions plus that point's load and per-request rows), so any one file stands alone.
"""

from __future__ import annotations

from datetime import datetime, timezone

SCHEMA = "splitserve.bench/v1"


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
