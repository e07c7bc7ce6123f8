"""Client parsing, result JSON schema, plots, compare and the CLI, against an in-process fake server."""

from __future__ import annotations

import json

import pytest
import uvloop
from typer.testing import CliRunner

from bench.lib.bench import BenchConfig, BenchError, run_bench
from bench.lib.client import Client
from bench.lib.report import validate
from bench.lib.server import Target, is_loopback, metric_deltas, parse_prometheus
from bench.lib.workloads import WorkloadSpec
from cli.main import app
from tests.bench.fake_server import FakeServer

PNG = b"\x89PNG\r\n\x1a\n"


def _stream(server: FakeServer, body: dict):
    async def go():
        client = Client(server.url)
        try:
            return await client.stream("/v1/completions", body, 10.0)
        finally:
            await client.aclose()

    return uvloop.run(go())


def test_client_counts_tokens_per_chunk_from_continuous_usage():
    with FakeServer(chunk_tokens=3) as server:
        base = {"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 7, "stream": True}
        res = _stream(server, {**base, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        assert res.ok and res.done and res.status == 200
        assert res.chunk_tokens == [3, 3, 1]  # from usage growth
        assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens) == (4, 7, 2)
        assert res.finish_reason == "length"
        assert all(b >= a for a, b in zip(res.chunk_times_s, res.chunk_times_s[1:]))
        # without per-chunk usage: one token per text chunk (reconciled later by attribute_tokens)
        res = _stream(server, {**base, "stream_options": {"include_usage": True}})
        assert res.chunk_tokens == [1, 1, 1] and res.completion_tokens == 7
    with FakeServer(fail_every=1) as server:
        res = _stream(server, {"model": "m", "prompt": [1], "max_tokens": 2, "stream": True})
        assert not res.ok and res.error.startswith("HTTP 503")


def test_prometheus_parse_and_deltas():
    text = ('# HELP a x\n# TYPE a counter\na_total 3.0\nb_total{z="1",where="remote"} 2\n'
            'h_bucket{le="0.1"} 5\nh_count 5\nh_sum 0.5\ng 7\nweird line\n')
    parsed = parse_prometheus(text)
    assert parsed == {"a_total": 3.0, 'b_total{where="remote",z="1"}': 2.0, 'h_bucket{le="0.1"}': 5.0,
                      "h_count": 5.0, "h_sum": 0.5, "g": 7.0}
    after = {**parsed, "a_total": 10.0, "h_count": 6.0, "h_bucket{le=\"0.1\"}": 9.0, "g": 1.0,
             'splitserve_frontend_migrations_total': 2.0}
    d = metric_deltas(parsed, after)
    assert d["deltas"] == {"a_total": 7.0, "h_count": 1.0, "splitserve_frontend_migrations_total": 2.0}
    assert d["highlights"]["migrations"] == 2.0 and d["highlights"]["prefill_remote"] is None
    assert metric_deltas(None, after)["scraped"] is False


def test_targets_and_loopback():
    t = Target.parse("localhost:8000/v1/")
    assert (t.url, t.host, t.port, t.path_prefix) == ("http://localhost:8000", "localhost", 8000, "")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("8.8.8.8")
    with pytest.raises(BenchError, match="loopback"):
        run_bench(BenchConfig(url="http://10.0.0.1:9", num_requests=1), echo=lambda s: None)


def test_warm_prefixes_sends_each_prefix_once_before_each_point_and_fails_loudly(tmp_path):
    spec = WorkloadSpec(kind="shared-prefix", num_prefixes=3, prefix_len=16, suffix_len="4", osl="5")
    with FakeServer() as server:
        cfg = BenchConfig(url=server.url, workload=spec, concurrency=[2, 2], num_requests=6, warm_prefixes=True,
                          output=tmp_path / "w", progress=False, plots=False)
        doc = run_bench(cfg, echo=lambda s: None)
        bodies = server.bodies
    assert len(bodies) == 2 * (3 + 6)
    for point in range(2):
        warm, measured = bodies[point * 9:point * 9 + 3], bodies[point * 9 + 3:point * 9 + 9]
        assert all(b["max_tokens"] == 1 for b in warm) and all(b["max_tokens"] == 5 for b in measured)
        assert {tuple(b["prompt"][:16]) for b in measured} <= {tuple(b["prompt"][:16]) for b in warm}
    assert doc["points"][0]["results"]["num_requests"] == 6  # the warm-up is not measured
    assert doc["conditions"]["warm_prefixes"]
    with pytest.raises(BenchError, match="shared-prefix"):
        run_bench(BenchConfig(url="http://127.0.0.1:9", warm_prefixes=True), echo=lambda s: None)
    with FakeServer(fail_every=1) as server, pytest.raises(BenchError, match="warming prefixes: 3 of 3 failed"):
        run_bench(BenchConfig(url=server.url, workload=spec, concurrency=[1], num_requests=2, warm_prefixes=True,
                              output=tmp_path / "f", progress=False, plots=False), echo=lambda s: None)


def test_run_json_schema_plots_and_compare(tmp_path):
    with FakeServer(chunk_tokens=2, fail_every=10) as server:
        cfg = BenchConfig(url=server.url, workload=WorkloadSpec(kind="synthetic", isl="uniform:8:16", osl="6"),
                          concurrency=[1, 3], num_requests=20, slo={"ttft_ms": 1000.0}, output=tmp_path / "a",
                          label="A", conditions={"transfer_backend": "nixl", "pd": "1:1"}, progress=False,
                          argv=["splitserve", "bench"])
        doc = run_bench(cfg, echo=lambda s: None)
        assert server.bodies[0]["model"] == "fake-model"  # the server's first model
        assert server.bodies[0]["ignore_eos"] is True and server.bodies[0]["max_tokens"] == 6
        cfg_b = BenchConfig(**{**cfg.__dict__, "output": tmp_path / "b", "label": "B", "concurrency": [3, 1]})
        run_bench(cfg_b, echo=lambda s: None)
        prompts = [tuple(b["prompt"]) for b in server.bodies]
        assert set(prompts[:20]) == set(prompts[40:60])  # same salt, same point: same prompts
        assert not set(prompts[:20]) & set(prompts[20:40])  # another point: fresh prompts
    out = tmp_path / "a"
    run = json.loads((out / "run.json").read_text())
    assert validate(run) == [] and "schema_problems" not in doc
    assert len(run["points"]) == 2 and [p["load"]["concurrency"] for p in run["points"]] == [1, 3]
    c = run["conditions"]
    assert c["model"] == "fake-model" and c["transfer_backend"] == "nixl" and c["pd_split"] == "1:1"
    assert c["workload"]["isl"] == {"kind": "uniform", "low": 8.0, "high": 16.0, "spec": "uniform:8:16"}
    assert c["machine"]["nproc"] >= 1 and isinstance(c["machine"]["cpu_model"], str)
    assert "commit" in c["git"] and c["user"]["label"] == "A" and c["client"]["prompt_salt"] == cfg.prompt_salt
    assert c["server"]["health"]["num_prefill_workers"] == 1
    for i in range(2):
        point = json.loads((out / f"point-{i}.json").read_text())
        assert validate(point) == []
        r = point["results"]
        assert r["num_requests"] == 20 and r["num_errors"] == 2 and r["error_kinds"] == {"HTTP 503": 2}
        assert r["output_tokens"] == 18 * 6
        assert r["itl_ms"]["n"] == 18 * 5  # 6 tokens -> 5 gaps per ok request
        assert r["cached_token_share"] is not None and 0.3 < r["cached_token_share"] <= 0.5
        assert r["goodput_requests_per_s"] > 0
        assert len(point["requests"]) == 20 and all(isinstance(q["e2e_ms"], float) for q in point["requests"])
        assert point["server_metrics"]["highlights"]["prefill_remote"] == 20.0
    for png in ("sweep.png", "latency.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    # a broken document is caught
    bad = json.loads((out / "point-0.json").read_text())
    del bad["results"]["ttft_ms"]
    bad["conditions"]["seed"] = "0"
    assert set(validate(bad)) == {"point.results.ttft_ms missing", "point.conditions.seed is str, expected int"}

    result = CliRunner().invoke(app, ["bench", "compare", str(out / "run.json"), str(tmp_path / "b" / "run.json")])
    assert result.exit_code == 0, result.output
    assert "concurrency 1" in result.output and "concurrency 3" in result.output and "B/A" in result.output
    assert "user.label: A  ->  B" in result.output
    assert "TTFT p99 ms" in result.output and "srv prefill_remote" in result.output


def test_cli_flags_and_errors(tmp_path):
    runner = CliRunner()
    with FakeServer(chunk_tokens=1) as server:
        res = runner.invoke(app, ["bench", "--url", server.url, "--endpoint", "chat", "--workload", "multi-turn",
                                  "--isl", "8", "--osl", "3", "--turns", "2", "--rate", "50", "--num-requests", "6",
                                  "--slo", "ttft_ms=500,itl_ms=100", "--no-progress", "--no-plots", "-o",
                                  str(tmp_path / "c"), "--conditions", "transfer_backend=none"])
        assert res.exit_code == 0, res.output
        run = json.loads((tmp_path / "c" / "run.json").read_text())
        assert run["points"][0]["load"]["mode"] == "open" and run["points"][0]["load"]["rate"] == 50.0
        assert run["points"][0]["results"]["num_ok"] == 6
        assert run["conditions"]["slo"] == {"ttft_ms": 500.0, "itl_ms": 100.0}
        assert [b["messages"][-1]["role"] for b in server.bodies] == ["user"] * 6
        assert not (tmp_path / "c" / "sweep.png").exists()
        for _ in range(2):  # default: a fresh prompt salt per run, so runs do not share a warm cache
            res = runner.invoke(app, ["bench", "--url", server.url, "--isl", "8", "--osl", "2", "--num-requests", "1",
                                      "--no-progress", "--no-plots", "-o", str(tmp_path / "d")])
            assert res.exit_code == 0, res.output
        assert server.bodies[-1]["prompt"] != server.bodies[-2]["prompt"]
        for args, msg in ((["--isl", "normal:5"], "--isl"), (["--slo", "foo=1"], "bad SLO"),
                          (["--concurrency", "2", "--rate", "1"], "not both"),
                          (["--workload", "nope"], "--workload"), (["--url", "http://10.9.9.9:1"], "loopback")):
            res = runner.invoke(app, ["bench", "--url", server.url, "--num-requests", "1", "-o",
                                      str(tmp_path / "x"), *args])
            assert res.exit_code == 2 and msg in res.output, (args, res.output)
