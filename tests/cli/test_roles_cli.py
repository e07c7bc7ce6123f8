"""`up --switchable/--fixed-role` reaches every worker's command line; `router set-role` refuses a bad role
before asking any router."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.graph_spec import GraphSpec, worker_command
from cli.main import app


def test_worker_commands_carry_the_switchable_choice() -> None:
    def flags(switchable):
        cmd = worker_command(GraphSpec(engine="mock", switchable=switchable), Path("m"), "tcp://r:1", "prefill", 0)
        return [a for a in cmd if a in ("--switchable", "--fixed-role")]

    assert (flags(True), flags(False), flags(None)) == (["--switchable"], ["--fixed-role"], [])


def test_set_role_refuses_a_role_that_is_no_pool() -> None:
    result = CliRunner().invoke(app, ["router", "set-role", "w1", "both", "--router", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "role must be prefill or decode" in result.output


def test_set_role_without_a_router_says_so() -> None:
    result = CliRunner().invoke(app, ["router", "set-role", "w1", "decode", "--router", "tcp://127.0.0.1:1",
                                      "--timeout-s", "0.3"])
    assert result.exit_code == 2 and "error:" in result.output
