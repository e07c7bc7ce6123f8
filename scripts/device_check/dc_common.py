"""What the device check's parts share: the repository on sys.path, NIXL's API from whichever wheel is there, and
writing one JSON result. Runs on a bare GPU machine: python3, torch, numpy and the NIXL wheel only."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def nixl_api():
    """``nixl._api`` (the meta package), else the CUDA wheel's own module (the device check carries only
    nixl-cu13, whose package is ``nixl_cu13``)."""
    import importlib

    errors = []
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("no NIXL: " + "; ".join(errors))


def write_json(path: str, result: dict) -> None:
    result = {**result, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(result, indent=2, sort_keys=True)
    Path(path).write_text(text + "\n")
    print(text)


def gbps(num_bytes: int, seconds: float) -> float:
    return round(num_bytes / max(seconds, 1e-9) / 1e9, 3)
