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


def test_one_config_file_for_ups_options_the_engines_and_each_pool(launched, tmp_path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text("prefill: 2\ndecode: 3\nport: 8123\nmax-model-len: 4096\n"
                    "prefill-args:\n  max-num-batched-tokens: 8192\n"
                    "decode-args:\n  max-num-seqs: 128\n  enforce-eager: true\n")
    result = _up("--config", str(path), "--decode", "1")  # the command line wins
    assert result.exit_code == 0, result.output
    spec = launched[0]
    assert (spec.num_prefill, spec.num_decode, spec.port) == (2, 1, 8123)
    prefill, _, decode = worker_commands(spec, Path("m"), "tcp://127.0.0.1:1")  # 2 prefill, 1 decode
    assert prefill[prefill.index("--"):] == ["--", "--max-model-len", "4096", "--max-num-batched-tokens", "8192"]
    assert decode[decode.index("--"):] == ["--", "--max-model-len", "4096", "--max-num-seqs", "128",
                                          "--enforce-eager"]


def test_a_bad_engine_argument_in_the_config_file_is_vllms_error_before_anything_starts(launched, tmp_path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text("decode-args:\n  max-num-seqs: many\n")
    result = _up("--config", str(path))
    assert result.exit_code == 2 and "many" in result.output and launched == []
