"""`up`'s vLLM engine arguments: common ones (any option `up` does not know) and each pool's own, checked by vLLM's
parser before anything starts, and handed to each worker after its own options (`--`), pool after common."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.graph_spec import GraphSpec, frontend_commands, worker_commands
from cli.launcher import with_options

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@pytest.fixture()
def launched(monkeypatch):
    import cli.launcher

    specs: list[GraphSpec] = []
    monkeypatch.setattr(cli.launcher, "launch", lambda spec: specs.append(spec) or 0)
    return specs


def _up(*args: str):
    from cli.main import app

    return CliRunner().invoke(app, ["up", "--engine", "vllm", *args])


def test_common_and_pool_arguments_reach_each_worker_in_order(launched) -> None:
    result = _up("-tp", "2", "--max-model-len", "16k", "--prefill-args", "--max-num-batched-tokens 16384",
                 "--decode-args", "--max-num-seqs 256 -tp 1", "--served-model-name", "qwen3,q")
    assert result.exit_code == 0, result.output
    spec = launched[0]
    prefill, decode = worker_commands(spec, Path("m"), "tcp://127.0.0.1:1")
    assert prefill[prefill.index("--"):] == ["--", "-tp", "2", "--max-model-len", "16k",
                                            "--max-num-batched-tokens", "16384"]
    assert decode[decode.index("--"):] == ["--", "-tp", "2", "--max-model-len", "16k", "--max-num-seqs", "256",
                                          "-tp", "1"]  # the pool's -tp 1 comes last: argparse keeps it
    assert prefill[prefill.index("--served-model-name") + 1] == "qwen3"  # workers register the first name
    frontend = frontend_commands(spec, Path("m"), "tcp://127.0.0.1:1")[0]
    assert frontend[frontend.index("--served-model-name") + 1] == "qwen3,q"


@pytest.mark.parametrize(("args", "message"), [
    (("--max-modl-len", "5"), "did you mean --max-model-len?"),
    (("--decode-args", "--max-num-seqs x"), "(--decode-args)"),
    (("--prefill-args", "--kv-transfer-config {}"), "set by splitserve"),
    (("--prefill-args", "'unclosed"), "--prefill-args"),
])
def test_a_bad_engine_argument_stops_up_before_anything_starts(launched, args, message) -> None:
    result = _up(*args)
    assert result.exit_code == 2 and message in result.output
    assert launched == []


def test_without_engine_arguments_workers_get_none(launched) -> None:
    assert _up().exit_code == 0
    assert all("--" not in cmd for cmd in worker_commands(launched[0], Path("m"), "tcp://127.0.0.1:1"))


@pytest.mark.parametrize(("cmd", "options", "expected"), [
    (["router", "--x", "1"], ["--log-level", "info"], ["router", "--x", "1", "--log-level", "info"]),
    (["worker", "--a", "--", "-tp", "2"], ["--curve-dir", "k"], ["worker", "--a", "--curve-dir", "k", "--", "-tp", "2"]),
])
def test_a_services_own_options_go_before_the_engines(cmd, options, expected) -> None:
    assert with_options(cmd, options) == expected
