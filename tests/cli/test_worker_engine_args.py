"""`splitserve worker`: vLLM's names after `--` replace the worker's own options (block size, batch limits, context,
served name), so the engine, the router's hashes and the frontend agree; a bad one is vLLM's error, exit 2."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@pytest.fixture()
def tiny_model_dir():
    from tests.harness.graph import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture()
def started(monkeypatch):
    import cli.cmd_worker

    services = []
    monkeypatch.setattr(cli.cmd_worker, "run_service", lambda run, on_term=None: services.append(run.__self__))
    return services


def _worker(model_dir, *args: str):
    from cli.main import app

    return CliRunner().invoke(app, ["worker", "--model", str(model_dir), "--engine", "mock", *args])


def test_vllms_names_replace_the_workers_own_options(started, tiny_model_dir) -> None:
    result = _worker(tiny_model_dir, "--block-size", "32", "--", "--block-size", "16", "--max-model-len", "1000",
                     "--max-num-seqs", "3", "--served-model-name", "tiny-a", "tiny-b", "-tp", "2")
    assert result.exit_code == 0, result.output
    service = started[0]
    assert service.config.model == "tiny-a"  # the first served name; the frontend owns the aliases
    engine = service.engine
    assert (engine.block_size, engine.max_model_len, engine.config.max_num_seqs) == (16, 1000, 3)
    assert "ignores vLLM engine arguments tensor_parallel_size" in result.output


def test_a_bad_engine_argument_is_one_line_and_exit_2(started, tiny_model_dir) -> None:
    result = _worker(tiny_model_dir, "--", "--max-num-seqs", "many")
    assert result.exit_code == 2 and "invalid int value: 'many'" in result.output and started == []
