"""`splitserve bench` end to end against a real local graph (router, one mock worker, frontend)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.harness.graph import start_graph
from cli.main import app


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    g = start_graph(tmp_path_factory.mktemp("bench"), "--engine", "mock", "--mock-speedup", "inf", "--aggregated", "1")
    yield g
    g.stop()


def _run(args: list[str]) -> None:
    res = CliRunner().invoke(app, ["bench", "--no-progress", *args])
    assert res.exit_code == 0, res.output


def test_bench_synthetic_against_mock_graph(graph, tmp_path):
    out = tmp_path / "syn"
    _run(["--url", graph.url, "--isl", "64", "--osl", "16", "--concurrency", "4", "--num-requests", "50",
          "--slo", "ttft_ms=10000", "-o", str(out), "--label", "mock-agg"])
    run = json.loads((out / "run.json").read_text())
    point = json.loads((out / "point-0.json").read_text())
    c, r = run["conditions"], point["results"]
    assert c["model"] == "tiny" and c["endpoint"] == "completions"
    assert c["server"]["workers_by_role"] == {"both": 1} and c["server"]["engines"] == ["mock"]
    assert c["block_size"] == 32 and c["transfer_backend"].startswith("none")
    assert r["num_requests"] == 50 and r["num_ok"] == 50 and r["num_errors"] == 0
    assert r["prompt_tokens"] == 50 * 64 and r["output_tokens"] == 50 * 16
    assert r["ttft_ms"]["n"] == 50 and r["ttft_ms"]["min"] > 0 and r["ttft_ms"]["p99"] >= r["ttft_ms"]["p50"]
    assert r["itl_ms"]["n"] == 50 * 15 and r["itl_ms"]["min"] >= 0
    assert r["tpot_ms"]["n"] == 50 and r["e2e_ms"]["p50"] >= r["ttft_ms"]["p50"]
    assert r["requests_per_s"] > 0 and r["output_tokens_per_s"] == pytest.approx(16 * r["requests_per_s"], rel=1e-3)
    assert r["goodput_requests_per_s"] == r["requests_per_s"]
    assert all(q["ok"] and q["prompt_tokens"] == 64 and q["output_tokens"] == 16 for q in point["requests"])
    srv = point["server_metrics"]
    assert srv["scraped"] and srv["highlights"]["output_tokens"] == 800
    assert srv["highlights"]["prefill_local"] + srv["highlights"]["prefill_remote"] == 50
    assert srv["highlights"]["kv_transfer_failures"] == 0 and srv["highlights"]["migrations"] == 0
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_shared_prefix_reports_cached_tokens(graph, tmp_path):
    out = tmp_path / "sp"
    _run(["--url", graph.url, "--workload", "shared-prefix", "--num-prefixes", "1", "--prefix-len", "256",
          "--suffix-len", "32", "--osl", "4", "--concurrency", "2", "--num-requests", "20", "--no-plots",
          "-o", str(out)])
    r = json.loads((out / "point-0.json").read_text())["results"]
    assert r["num_ok"] == 20 and r["prompt_tokens"] == 20 * 288
    # after the first requests, the 256-token prefix (8 blocks of 32) comes from the cache
    assert 0.5 < r["cached_token_share"] < 256 / 288 + 1e-9
