"""`up --curve` / `--curve-dir`: the keys root a local graph's children get."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cli.graph_keys import check_graph_keys, graph_keys, graph_services, scaler_keys
from common.errors import SplitserveError
from common.security import load_curve_keys, make_curve_keys


def test_fresh_keys_are_private_to_the_run_and_removed_after() -> None:
    services = graph_services(kvtier=True, planner=True)
    with graph_keys(None, True) as root:
        assert root is not None and stat.S_IMODE(root.stat().st_mode) == 0o700
        for service in services:
            assert load_curve_keys(root / service).service == service
        assert scaler_keys(root).service == "scaler"
    assert not root.exists()


def test_given_root_is_checked_for_every_service_the_graph_runs(tmp_path: Path) -> None:
    root = make_curve_keys(tmp_path / "keys", services=("router", "worker", "kvtier", "frontend"))
    check_graph_keys(root, graph_services(kvtier=True, planner=False))
    with graph_keys(root, False) as got:
        assert got == root.resolve()
    with pytest.raises(SplitserveError):  # a planner graph also needs planner/ and scaler/
        check_graph_keys(root, graph_services(kvtier=True, planner=True))
    with graph_keys(None, False) as none:
        assert none is None and scaler_keys(none) is None
