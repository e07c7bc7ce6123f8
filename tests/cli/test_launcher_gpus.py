"""`up`'s launcher hands the control plane (router, kvtier, frontend) CUDA_VISIBLE_DEVICES="" and leaves a worker's
devices to the worker (its --gpus). Each child here is a real short-lived process standing in for the service:
the launcher sees it exit before the graph is ready and stops, as it would on a failed start."""

from __future__ import annotations

import subprocess

import cli.launcher
from cli.graph_spec import GraphSpec
from cli.ports import free_port


def test_control_plane_children_see_no_gpu(monkeypatch, tmp_path) -> None:
    from cli.logs import configure_logging
    from tests.harness.graph import tiny_model_dir

    import structlog

    # To this test's stderr: structlog caches a logger on first use, and an earlier CliRunner's stream is closed.
    configure_logging("warning")
    monkeypatch.setattr(cli.launcher, "log", structlog.get_logger("cli.launcher"))

    real_popen = subprocess.Popen
    spawned: list[tuple[str, dict[str, str]]] = []

    def popen(cmd, **kwargs):
        spawned.append((cmd[3], kwargs["env"]))  # [python, -m, cli.main, SERVICE, ...]
        return real_popen(["true"], start_new_session=True)

    monkeypatch.setattr(cli.launcher.subprocess, "Popen", popen)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the user's shell had
    spec = GraphSpec(model=tiny_model_dir(), engine="mock", port=free_port(), metrics_sd_file=tmp_path / "sd.json",
                     ready_timeout_s=5.0)
    assert cli.launcher.launch(spec) == 1  # the stand-ins exit: a failed start
    services = {service: env.get("CUDA_VISIBLE_DEVICES") for service, env in spawned}
    assert services == {"router": "", "kvtier": "", "worker": "0,1", "frontend": ""}
