"""`up --curve` / `up --curve-dir`: the CURVE keys every process of a local graph authenticates with.

``--curve`` makes fresh keys (``keys make``) in a private directory of this run (0700, the secrets 0600), removed
when the graph stops; ``--curve-dir`` uses a ``keys make`` root the operator keeps. Either way each child gets the
root as ``--curve-dir`` and picks its own ``<service>/`` (a path on its command line, never key material), and the
launcher follows the planner's ScaleRequests with the ``scaler`` keys.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.security import CurveKeys, load_curve_keys, make_curve_keys


def graph_services(kvtier: bool, planner: bool) -> tuple[str, ...]:
    """The key directories a graph's processes load (the launcher's ``scaler`` with a planner)."""
    return ("router", "worker", "frontend") + (("kvtier",) if kvtier else ()) + (("planner", "scaler") if planner else ())


def check_graph_keys(curve_dir: Path, services: tuple[str, ...]) -> None:
    """``SplitserveError`` when a given root lacks usable keys for one of ``services`` (before anything starts)."""
    for service in services:
        load_curve_keys(curve_dir / service)


@contextmanager
def graph_keys(curve_dir: Path | None, fresh: bool) -> Iterator[Path | None]:
    """The keys root for the graph's children (None: plain TCP)."""
    if fresh:
        root = Path(tempfile.mkdtemp(prefix="splitserve-curve-"))  # 0700: only this user reaches the secrets
        try:
            make_curve_keys(root)
            yield root
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    if curve_dir is None:
        yield None
        return
    yield curve_dir.resolve()


def scaler_keys(root: Path | None) -> CurveKeys | None:
    return load_curve_keys(root / "scaler") if root is not None else None
