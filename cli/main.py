"""splitserve's command line: one command per service (for systemd), `up` for a whole local graph.

Each command group lives in its own module (cli/cmd_*.py); this one assembles the app. Only this package reads the
environment and configures logging; services get frozen configs.
"""

from __future__ import annotations

import typer

from cli.bench import bench_app
from cli.cmd_frontend import frontend
from cli.cmd_kvtier import kvtier
from cli.cmd_planner import planner_cmd, planner_events
from cli.cmd_roles import set_role
from cli.cmd_router import router
from cli.cmd_sizing import plan, profile
from cli.cmd_tools import keys_make, make_tiny, make_tiny_lora
from cli.cmd_up import up
from cli.cmd_workers import workers
from cli.config_file import ConfigFileCommand, PooledConfigFileCommand
from cli.cmd_worker import worker

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Disaggregated LLM serving.")
model_app = typer.Typer(no_args_is_help=True, help="Model directories.")
keys_app = typer.Typer(no_args_is_help=True, help="ZeroMQ CURVE keys.")
app.add_typer(model_app, name="model")
app.add_typer(keys_app, name="keys")
app.add_typer(bench_app, name="bench")
# `splitserve router [OPTIONS]` runs the router; `splitserve router set-role WORKER ROLE` asks one to move a worker;
# `splitserve router workers` lists what it has registered.
router_app = typer.Typer(help="Run the router (no subcommand), or ask a running one to act.")
router_app.callback(invoke_without_command=True)(router)
router_app.command("set-role")(set_role)
router_app.command("workers")(workers)
app.add_typer(router_app, name="router")

# worker and up take vLLM's engine arguments as they are (cli/cmd_worker.py): unknown options pass through.
ENGINE_ARGS_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
# Both take `--config FILE.yaml` for all of their options and vLLM's (cli/config_file.py).
app.command(context_settings=ENGINE_ARGS_CONTEXT, cls=ConfigFileCommand)(worker)
app.command(context_settings=ENGINE_ARGS_CONTEXT, cls=PooledConfigFileCommand)(up)
for command in (kvtier, frontend, profile, plan):
    app.command()(command)
app.command("planner")(planner_cmd)
app.command("planner-events")(planner_events)
keys_app.command("make")(keys_make)
model_app.command("make-tiny")(make_tiny)
model_app.command("make-tiny-lora")(make_tiny_lora)


def frontend_main() -> None:
    from cli.child_setup import apply_launcher_setup

    apply_launcher_setup()  # a copy of `splitserve-frontend --processes N`: die with it
    typer.run(frontend)


def router_main() -> None:
    typer.run(router)


def worker_main() -> None:
    one = typer.Typer(add_completion=False)
    one.command(context_settings=ENGINE_ARGS_CONTEXT, cls=ConfigFileCommand)(worker)
    one()


if __name__ == "__main__":
    from cli.child_setup import apply_launcher_setup

    apply_launcher_setup()  # a child of `splitserve up`: its cores, and die with the launcher
    app()
