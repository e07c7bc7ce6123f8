"""`--kv-transfer` on `worker` and `up`: pull or push, anything else refused before anything starts."""

from __future__ import annotations

import pytest
import structlog
from typer.testing import CliRunner

from cli.main import app


@pytest.fixture(autouse=True)
def _keep_logging():
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize("command", [["worker", "--model", "/nonexistent"], ["up", "--engine", "mock"]])
def test_an_unknown_transfer_mode_is_refused(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--kv-transfer", "sideways"])
    assert result.exit_code == 2, result.output
    assert "pull, push" in result.output and "sideways" in result.output


def test_both_commands_offer_the_flag() -> None:
    for command in ("worker", "up"):
        assert "--kv-transfer" in CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
