"""`up --help` groups its options in panels, one per part of the graph."""

from __future__ import annotations

import click
import typer
from typer.testing import CliRunner

from cli.cmd_up import PANELS
from cli.main import app


def test_up_help_shows_every_panel() -> None:
    result = CliRunner().invoke(app, ["up", "--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    for panel in ("Engine and model", "Pools", "Routing", "KV tier", "Planner", "Network", "Frontend HTTP", "Logging"):
        assert f"─ {panel}" in result.output, panel


def test_every_up_option_is_in_a_panel() -> None:
    command = typer.main.get_command(app).commands["up"]  # type: ignore[attr-defined]
    unpanelled = [p.name for p in command.params
                  if isinstance(p, click.Option) and p.name != "help" and getattr(p, "rich_help_panel", None) is None]
    assert unpanelled == []
    assert {p.rich_help_panel for p in command.params if p.name != "help"} == set(PANELS)  # type: ignore[attr-defined]


def test_up_panels_leave_other_commands_alone() -> None:
    """The shared --log-level option is copied into `up`'s panel, not moved there for every command."""
    result = CliRunner().invoke(app, ["router", "--help"], terminal_width=120)
    assert result.exit_code == 0 and "Logging and metrics" not in result.output
