"""bench/frontend.py's CPU accounting and core plan (pure parts)."""

from __future__ import annotations

import pytest

from bench.frontend import core_plan
from bench.frontend_cpu import _service_name, cpu_per_request


def test_cpu_per_request_sums_every_server_process() -> None:
    before = {"launcher": 1.0, "router": 2.0, "frontend-0": 3.0, "frontend-1": 4.0, "worker-both-0": 5.0,
              "worker-both-1": 6.0}
    after = {"launcher": 1.01, "router": 2.2, "frontend-0": 3.5, "frontend-1": 4.5, "worker-both-0": 5.1,
             "worker-both-1": 6.1}
    cpu = cpu_per_request(before, after, 1000)  # ms per request: CPU seconds * 1000 / 1000 requests
    assert cpu.frontends_total == pytest.approx(1.0)
    assert cpu.router == pytest.approx(0.2)
    assert cpu.workers_total == pytest.approx(0.2)
    assert cpu.launcher == pytest.approx(0.01)
    assert cpu.server_total == pytest.approx(1.41)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["python", "-m", "cli.main", "frontend", "--model", "m"], "frontend"),
        (["python", "-m", "cli.main", "worker", "--role", "both", "--worker-id", "both-1"], "worker-both-1"),
        (["python", "-m", "cli.main", "up", "--engine", "mock"], "launcher"),
        (["python", "-m", "cli.main", "router"], "router"),
        (["sh", "-c", "x"], "other"),
    ],
)
def test_service_names_from_command_lines(args: list[str], name: str) -> None:
    assert _service_name(args) == name


@pytest.mark.parametrize(
    ("cores", "server", "client"),
    [
        ([0, 1], {0, 1}, {1}),  # 2 cores: the server may use both (a second frontend needs somewhere to run)
        ([0, 1, 2], {0, 1, 2}, {2}),
        ([0, 1, 2, 3], {0, 1, 2}, {3}),
        ([4, 5, 6, 7, 8], {4, 5, 6, 7}, {8}),
    ],
)
def test_core_plan(cores: list[int], server: set[int], client: set[int]) -> None:
    assert core_plan(cores) == (server, client)
