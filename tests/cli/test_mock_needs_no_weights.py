"""The mock engine simulates a model from its config.json and tokenizer alone; vLLM still needs the weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import structlog
from typer.testing import CliRunner

from tests.harness.graph import tiny_model_dir
from cli.main import app
from common.errors import ModelError
from common.tiny_model import validate_model_dir

TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def weightless_model(tmp: Path) -> Path:
    """A real model's directory without its *.safetensors (e.g. a tokenizer fetched for a simulation)."""
    out = tmp / "weightless"
    out.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir() / name, out / name)
    return out


@pytest.fixture(autouse=True)
def _default_logging():
    """The commands configure structlog onto CliRunner's stream, closed after each invoke: undo it for later tests."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def weightless(tmp_path_factory) -> Path:
    return weightless_model(tmp_path_factory.mktemp("model"))


def test_validation_without_weights_reads_config(weightless: Path) -> None:
    info = validate_model_dir(weightless, need_weights=False)
    assert info.num_layers == 4 and info.weight_files == ()
    with pytest.raises(ModelError, match=r"no \*\.safetensors weight files"):
        validate_model_dir(weightless)


def test_mock_worker_accepts_a_weightless_model(weightless: Path, tmp_path: Path) -> None:
    # A bad --mock-profile is reported after the model directory passed validation: the worker got that far.
    result = CliRunner().invoke(app, ["worker", "--engine", "mock", "--model", str(weightless),
                                      "--mock-profile", str(tmp_path / "missing.json")])
    assert result.exit_code == 2, result.output
    assert "--mock-profile" in result.output and "safetensors" not in result.output


@pytest.mark.parametrize("command", ["worker", "up"])
def test_vllm_refuses_a_weightless_model_in_one_line(weightless: Path, command: str) -> None:
    result = CliRunner().invoke(app, [command, "--engine", "vllm", "--model", str(weightless)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "no *.safetensors weight files" in lines[0], lines
