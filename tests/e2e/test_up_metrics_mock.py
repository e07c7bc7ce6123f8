"""`up` as an operator sees it (mock engines, real processes): every service it starts serves Prometheus metrics,
listed in its file-SD target list, which follows restarts and drains; a mock graph runs on a model directory with
no weights (config.json and a tokenizer only); a killed launcher takes its children with it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.harness.graph import Graph, child_pid, start_graph, wait_until
from tests.cli.test_child_setup import alive
from tests.cli.test_mock_needs_no_weights import weightless_model

PREFIXES = {"router": "splitserve_router_", "worker": "splitserve_worker_", "kvtier": "splitserve_kvtier_",
            "frontend": "splitserve_frontend_"}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("up-metrics")


@pytest.fixture(scope="module")
def graph(tmp: Path) -> Graph:
    graph = start_graph(tmp, "--engine", "mock", "--model", str(weightless_model(tmp)), "--prefill", "1",
                        "--decode", "2", "--mock-speedup", "10", "--num-blocks", "512",
                        "--metrics-sd-file", str(tmp / "run" / "targets.json"))
    yield graph
    graph.stop()


@pytest.fixture()
def sd_path(tmp: Path) -> Path:
    return tmp / "run" / "targets.json"


def read_groups(sd_path: Path) -> list[dict]:
    return json.loads(sd_path.read_text())


def exports(address: str, prefix: str) -> bool:
    """A sample (not only a HELP line) of the service's own metrics is served at ``address``."""
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=2).text
    except httpx.HTTPError:
        return False
    return any(line.startswith(prefix) for line in text.splitlines())


def test_every_service_is_a_scrape_target_serving_its_metrics(graph: Graph, sd_path: Path) -> None:
    assert f"Prometheus targets (file_sd_configs): {sd_path}" in graph.logs()
    groups = read_groups(sd_path)
    labels = sorted((g["labels"]["service"], g["labels"].get("worker_id", "")) for g in groups)
    assert labels == [("frontend", ""), ("kvtier", ""), ("router", ""),
                      ("worker", "decode-1"), ("worker", "decode-2"), ("worker", "prefill-0")]
    for group in groups:
        (address,) = group["targets"]
        service = group["labels"]["service"]
        assert group["labels"]["job"] == f"splitserve-{service}"
        # Workers set their gauges on their first heartbeat.
        assert wait_until(lambda: exports(address, PREFIXES[service]), timeout_s=15), (service, address)
    roles = {g["labels"]["worker_id"]: g["labels"]["role"] for g in groups if "role" in g["labels"]}
    assert roles == {"prefill-0": "prefill", "decode-1": "decode", "decode-2": "decode"}


def test_mock_graph_serves_a_model_directory_without_weights(graph: Graph) -> None:
    resp = httpx.post(f"{graph.url}/v1/completions", timeout=30,
                      json={"model": "weightless", "prompt": "def f(x):", "max_tokens": 8})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 8


def test_a_restarted_worker_keeps_its_target(graph: Graph, sd_path: Path) -> None:
    before = {g["labels"].get("worker_id", g["labels"]["service"]): g["targets"] for g in read_groups(sd_path)}
    inode = sd_path.stat().st_ino
    old_pid = child_pid(graph, "--worker-id decode-2")
    os.kill(old_pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return child_pid(graph, "--worker-id decode-2") != old_pid
        except LookupError:
            return False

    assert wait_until(restarted, timeout_s=30)
    assert wait_until(lambda: sd_path.stat().st_ino != inode, timeout_s=5)
    after = {g["labels"].get("worker_id", g["labels"]["service"]): g["targets"] for g in read_groups(sd_path)}
    assert after == before  # same command, same port: Prometheus keeps one series per worker
    assert wait_until(lambda: exports(before["decode-2"][0], PREFIXES["worker"]), timeout_s=30)


def test_a_drained_worker_leaves_the_targets(graph: Graph, sd_path: Path) -> None:
    os.kill(child_pid(graph, "--worker-id decode-2"), signal.SIGTERM)  # idle: drains at once, exits 0
    gone = lambda: "decode-2" not in {g["labels"].get("worker_id") for g in read_groups(sd_path)}  # noqa: E731
    assert wait_until(gone, timeout_s=30), read_groups(sd_path)
    assert {g["labels"].get("worker_id") for g in read_groups(sd_path)} >= {"prefill-0", "decode-1"}


def test_a_stopped_graph_removes_its_target_list(tmp_path: Path) -> None:
    sd_path = tmp_path / "targets.json"
    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--no-kvtier", "--mock-speedup", "10",
                        "--num-blocks", "256", "--metrics-sd-file", str(sd_path))
    try:
        assert [g["labels"]["service"] for g in json.loads(sd_path.read_text())] == ["router", "worker", "frontend"]
    finally:
        graph.stop()
    assert graph.proc.returncode == 0 and not sd_path.exists()


def test_a_killed_launcher_takes_its_children_and_leaves_its_targets(tmp_path: Path) -> None:
    sd_path = tmp_path / "targets.json"
    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "1", "--mock-speedup", "10",
                        "--num-blocks", "256", "--metrics-sd-file", str(sd_path))
    try:
        pids = [child_pid(graph, f"cli.main {service}") for service in ("router", "kvtier", "worker", "frontend")]
        graph.proc.kill()  # SIGKILL: no clean-up; each child's parent-death signal stops it
        graph.proc.wait()
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=20), pids
        assert len(json.loads(sd_path.read_text())) == 4  # left for Prometheus to show the graph down
    finally:
        graph.stop()

