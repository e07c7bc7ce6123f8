"""`up --gpus`: the graph's workers get their devices (`--gpus` on each worker's command line) and, on a shared
device, their share of its memory; refusals stop `up` before anything starts. No engine starts: `launch` is
replaced and the resolved graph is read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli.gpus
from cli.graph_spec import GraphSpec, kvtier_command, worker_commands

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@pytest.fixture()
def launched(monkeypatch):
    import cli.cmd_up
    import cli.launcher

    specs: list[GraphSpec] = []
    # Logging stays as it is: `up` would point it at CliRunner's stream, closed after each call.
    monkeypatch.setattr(cli.cmd_up, "configure_logging", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli.launcher, "launch", lambda spec: specs.append(spec) or 0)
    monkeypatch.setattr(cli.gpus, "listed_gpus", lambda: tuple(range(8)))  # as `nvidia-smi -L` on an 8-GPU host
    return specs


def _up(*args: str):
    from cli.main import app

    return CliRunner().invoke(app, ["up", "--engine", "vllm", "--no-kvtier", *args])


def _workers(spec: GraphSpec) -> list[tuple[str, str, list[str]]]:
    out = []
    for cmd in worker_commands(spec, Path("m"), "tcp://127.0.0.1:1"):
        engine = cmd[cmd.index("--") + 1:] if "--" in cmd else []
        out.append((cmd[cmd.index("--role") + 1], cmd[cmd.index("--gpus") + 1], engine))
    return out


def test_eight_gpus_as_two_prefill_tp2_and_four_decode(launched) -> None:
    result = _up("--gpus", "0-7", "--prefill", "2", "--decode", "4", "--prefill-args", "-tp 2")
    assert result.exit_code == 0, result.output
    assert _workers(launched[0]) == [
        ("prefill", "0,1", ["-tp", "2"]), ("prefill", "2,3", ["-tp", "2"]),
        ("decode", "4", []), ("decode", "5", []), ("decode", "6", []), ("decode", "7", []),
    ]


def test_one_gpu_for_prefill_and_decode_splits_its_memory(launched) -> None:
    result = _up("--gpus", "0", "--max-model-len", "4096")
    assert result.exit_code == 0, result.output
    assert _workers(launched[0]) == [
        ("prefill", "0", ["--gpu-memory-utilization", "0.45", "--max-model-len", "4096"]),
        ("decode", "0", ["--gpu-memory-utilization", "0.45", "--max-model-len", "4096"]),
    ]


def test_the_users_memory_fraction_wins(launched) -> None:
    result = _up("--gpus", "all", "--prefill", "9", "--decode", "7", "--decode-args", "--gpu-memory-utilization 0.2")
    assert result.exit_code == 0, result.output
    workers = _workers(launched[0])
    assert workers[0] == ("prefill", "0", ["--gpu-memory-utilization", "0.45"])
    assert workers[-1] == ("decode", "7", ["--gpu-memory-utilization", "0.2"])  # theirs, none added


@pytest.mark.parametrize(("args", "message"), [
    (("--gpus", "0-8"), "no device 8 on this machine"),
    (("--gpus", "0-1", "-tp", "4"), "one engine needs 4 GPUs"),
    (("--gpus", "0-2", "--prefill", "2", "--decode", "0", "-tp", "2"), "uneven"),
    (("--gpus", "x"), "'x' is not a device id"),
    (("--gpus", "0", "--planner"), "planner"),
    (("--gpus", "0", "--engine", "mock"), "mock"),
])
def test_refusals_stop_up_before_anything_starts(launched, args, message) -> None:
    result = _up(*args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert launched == []


def test_without_gpus_workers_get_no_devices(launched) -> None:
    assert _up().exit_code == 0
    assert all("--gpus" not in cmd for cmd in worker_commands(launched[0], Path("m"), "tcp://127.0.0.1:1"))
    assert "--gpus" not in kvtier_command(GraphSpec(engine="mock"), "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
