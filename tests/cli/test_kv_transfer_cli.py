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


def test_a_switchable_pushing_worker_binds_a_dialable_side_channel_whatever_its_role_now() -> None:
    # It prefills now but may decode after a SetRole: then prefill engines dial its side channel.
    base = ["worker", "--engine", "vllm", "--model", "/nonexistent", "--role", "prefill", "--kv-transfer", "push",
            "--nixl-advertise", "10.0.0.5"]
    refused = CliRunner().invoke(app, [*base, "--switchable", "--nixl-host", "0.0.0.0"])
    assert refused.exit_code == 2 and "--kv-transfer push" in refused.output, refused.output
    fixed = CliRunner().invoke(app, [*base, "--fixed-role", "--nixl-host", "0.0.0.0"])
    # Past the address checks (a fixed prefill worker's address travels rewritten): the model is what fails.
    assert fixed.exit_code == 2 and "--kv-transfer push" not in fixed.output and "/nonexistent" in fixed.output
    # Push with kv_both is served (no longer refused): this one, too, gets as far as the model.
    served = CliRunner().invoke(app, [*base, "--switchable", "--nixl-host", "127.0.0.1"])
    assert served.exit_code == 2 and "/nonexistent" in served.output and "pulls KV" not in served.output
