"""`splitserve router workers` lists what a running router registered (a real mock graph from `up`)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.harness.graph import start_graph
from cli.main import app


def test_router_workers_lists_every_registered_worker_as_a_table_and_as_json(tmp_path) -> None:
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "1", "--no-kvtier")
    try:
        table = CliRunner().invoke(app, ["router", "workers", "--router", graph.router])
        assert table.exit_code == 0, table.output
        header, *lines = table.output.strip().splitlines()
        assert header.split()[:4] == ["WORKER_ID", "ROLE", "NODE", "ENDPOINT"]
        assert [line.split()[:2] for line in lines] == [["decode-1", "decode"], ["prefill-0", "prefill"]]
        as_json = CliRunner().invoke(app, ["router", "workers", "--router", graph.router, "--json"])
        rows = json.loads(as_json.output)["workers"]
        assert [(r["worker_id"], r["state"], r["engine"]) for r in rows] == [("decode-1", "serving", "mock"),
                                                                             ("prefill-0", "serving", "mock")]
        assert all(r["endpoint"].startswith("tcp://127.0.0.1:") for r in rows)
    finally:
        graph.stop()


def test_router_workers_without_a_router_says_so() -> None:
    result = CliRunner().invoke(app, ["router", "workers", "--router", "tcp://127.0.0.1:1", "--timeout-s", "0.3"])
    assert result.exit_code == 2 and "error:" in result.output
