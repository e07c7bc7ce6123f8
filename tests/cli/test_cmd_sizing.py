"""`splitserve profile` then `splitserve plan`, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner


def test_cli_profile_then_plan(tmp_path: Path) -> None:
    from cli.main import app

    out = tmp_path / "mock.json"
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--engine", "mock", "--quick", "--mock-speedup", "50",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["conditions"]["engine"] == "mock"
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "512", "--osl", "64", "--rate", "5",
                                 "--slo", "ttft_ms=1000,itl_ms=50", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["decision"]["mode"] in ("aggregated", "disaggregated")
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "128,2048", "--osl", "64",
                                 "--concurrency", "8", "--slo", "ttft_ms=1000,itl_ms=50"])
    assert result.exit_code == 0, result.output
    assert "recommendation:" in result.output
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "128", "--osl", "64", "--rate", "1",
                                 "--slo", "ttft_ms=1000"])
    assert result.exit_code == 2
