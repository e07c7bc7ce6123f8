"""`--config FILE.yaml` for `up` and `worker`: the file's keys become arguments before the command line's, so the
command line wins; splitserve's own options and vLLM's engine arguments side by side; `up`'s pools as mappings.
And SPLITSERVE_ENGINE_ARGS, the deploy files' way to give a worker its pool's engine arguments."""

from __future__ import annotations

import importlib.util

import click
import pytest
from typer.testing import CliRunner

from cli.config_file import config_args, expand_config

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@pytest.mark.parametrize(("config", "pools", "expected"), [
    ({"max-model-len": 32768}, False, ["--max-model-len", "32768"]),
    ({"max_num_seqs": 8}, False, ["--max-num-seqs", "8"]),  # vLLM's files may use either spelling
    ({"enforce-eager": True, "enable-chunked-prefill": False}, False,
     ["--enforce-eager", "--no-enable-chunked-prefill"]),
    ({"served-model-name": ["qwen3", "Qwen/Qwen3-8B"]}, False, ["--served-model-name", "qwen3,Qwen/Qwen3-8B"]),
    ({"compilation-config": {"mode": 3}}, False, ["--compilation-config", '{"mode": 3}']),
    ({"revision": None}, False, []),
    ({"decode": 4, "decode-args": {"max-num-seqs": 256, "enforce-eager": True}}, True,
     ["--decode", "4", "--decode-args", "--max-num-seqs 256 --enforce-eager"]),
    ({"prefill-args": "--max-num-batched-tokens 8192"}, True, ["--prefill-args", "--max-num-batched-tokens 8192"]),
])
def test_config_args(config, pools, expected) -> None:
    assert config_args(config, pools) == expected


def test_the_file_goes_first_so_the_command_line_wins(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("max-model-len: 4096\nport: 9000\n")
    assert expand_config(["--port", "8080", "--config", str(path)], False) == [
        "--max-model-len", "4096", "--port", "9000", "--port", "8080"]
    assert expand_config([f"--config={path}"], False) == ["--max-model-len", "4096", "--port", "9000"]


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n- b\n", "a mapping of option names"),
    ("a: [\n", "not YAML"),
])
def test_a_bad_file_is_a_usage_error(tmp_path, text, message) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(click.UsageError, match=message):
        expand_config(["--config", str(path)], False)
    with pytest.raises(click.UsageError, match="No such file"):
        expand_config(["--config", str(tmp_path / "missing.yaml")], False)


@pytest.fixture()
def started(monkeypatch):
    import cli.cmd_worker

    services = []
    monkeypatch.setattr(cli.cmd_worker, "run_service", lambda run, on_term=None: services.append(run.__self__))
    return services


@needs_vllm
def test_worker_takes_its_own_options_and_vllms_from_one_file(started, tmp_path, monkeypatch) -> None:
    from cli.main import app
    from tests.harness.graph import tiny_model_dir

    monkeypatch.delenv("SPLITSERVE_ENGINE_ARGS", raising=False)
    path = tmp_path / "worker.yaml"
    path.write_text(f"model: {tiny_model_dir()}\nengine: mock\nrole: decode\nmax-model-len: 1000\n"
                    "max-num-seqs: 3\n")
    result = CliRunner().invoke(app, ["worker", "--config", str(path), "--max-num-seqs", "5"])
    assert result.exit_code == 0, result.output
    engine = started[0].engine
    assert (started[0].config.role, engine.max_model_len, engine.config.max_num_seqs) == ("decode", 1000, 5)


@needs_vllm
def test_worker_reads_its_pools_engine_arguments_from_the_environment(started, monkeypatch) -> None:
    from cli.main import app
    from tests.harness.graph import tiny_model_dir

    monkeypatch.setenv("SPLITSERVE_ENGINE_ARGS", "--max-model-len 900 --max-num-seqs 2")
    result = CliRunner().invoke(app, ["worker", "--model", str(tiny_model_dir()), "--engine", "mock",
                                      "--max-num-seqs", "4"])
    assert result.exit_code == 0, result.output
    engine = started[0].engine
    assert (engine.max_model_len, engine.config.max_num_seqs) == (900, 4)  # the command line wins
    monkeypatch.setenv("SPLITSERVE_ENGINE_ARGS", "--max-num-seqs many")
    result = CliRunner().invoke(app, ["worker", "--model", str(tiny_model_dir()), "--engine", "mock"])
    assert result.exit_code == 2 and "invalid int value: 'many'" in result.output


def test_models_stand_for_repeated_model_and_name_options() -> None:
    from cli.config_file import ConfigError, config_args

    config = {"models": [{"model": "/m/tiny", "served-model-name": "tiny", "lora-modules": ["sql=/a", "b=/c"]},
                         {"model": "/m/copy", "served-model-name": ["tiny-copy", "tc"]}], "prefill": 1}
    assert config_args(config, pool_sections=True) == [
        "--model", "/m/tiny", "--served-model-name", "tiny", "--lora-modules", "sql=/a,b=/c",
        "--model", "/m/copy", "--served-model-name", "tiny-copy,tc", "--prefill", "1"]
    for bad in ([{"model": "/a"}, {"model": "/b", "served-model-name": "b"}],  # several: each named
                [{"served-model-name": "a"}], [{"model": "/a", "served-model-name": "a"},
                                               {"model": "/b", "served-model-name": "b", "lora-modules": "x=/y"}],
                "/a"):
        with pytest.raises(ConfigError):
            config_args({"models": bad}, pool_sections=True)
