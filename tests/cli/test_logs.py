"""Console logs: a traceback never carries frame locals (request headers, API keys, prompt text)."""

from __future__ import annotations

import structlog

from cli.logs import configure_logging


def test_console_traceback_has_no_locals(capsys) -> None:
    configure_logging("info", json=False, service="test")
    try:
        authorization = "Bearer sk-very-secret"  # noqa: F841 (a local a locals-printing renderer would show)
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("t").exception("crashed")
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert "ValueError: boom" in err
    assert "sk-very-secret" not in err
