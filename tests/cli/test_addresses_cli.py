"""The commands refuse an address peers could not dial before starting anything (one line, exit code 2)."""

from __future__ import annotations

import pytest
import structlog
from typer.testing import CliRunner

from cli.main import app


@pytest.fixture(autouse=True)
def _keep_logging():
    """The commands configure structlog to print to the runner's stderr, which is closed afterwards."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize(("args", "message"), [
    (["worker", "--model", "/nonexistent", "--endpoint", "tcp://0.0.0.0:5560"],
     "--endpoint tcp://0.0.0.0:5560 binds every interface; give --advertise"),
    (["worker", "--model", "/nonexistent", "--advertise", "0.0.0.0"], "--advertise 0.0.0.0: a wildcard"),
    (["worker", "--model", "/nonexistent", "--nixl-host", "0.0.0.0"], "--nixl-host 0.0.0.0 binds every interface"),
    (["worker", "--model", "/nonexistent", "--nixl-advertise", "::"], "--nixl-advertise ::"),
    (["kvtier", "--endpoint", "tcp://0.0.0.0:5570"], "--endpoint tcp://0.0.0.0:5570 binds every interface"),
    (["kvtier", "--advertise", "tcp://0.0.0.0:5570"], "--advertise tcp://0.0.0.0:5570: a wildcard"),
    (["router", "--events-advertise", "tcp://0.0.0.0:5551"], "--events-advertise tcp://0.0.0.0:5551: a wildcard"),
])
def test_wildcard_advertised_addresses_are_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_flags_of_every_host_facing_command() -> None:
    runner = CliRunner()
    expected = {
        "worker": ["--advertise", "--node", "--zone", "--nixl-host", "--nixl-advertise", "--nixl-port",
                   "--metrics-host"],
        "kvtier": ["--advertise", "--node", "--zone", "--metrics-host"],
        "router": ["--events-endpoint", "--events-advertise", "--metrics-host"],
    }
    for command, flags in expected.items():
        help_text = runner.invoke(app, [command, "--help"], terminal_width=200).output
        for flag in flags:
            assert flag in help_text, f"{command} lacks {flag}"
