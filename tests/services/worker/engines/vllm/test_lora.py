"""The vLLM engine's LoRA arguments from its start adapters (pure: no engine), and the CLI's --lora-modules."""

from __future__ import annotations

import pytest
import typer

from cli.options import lora_modules
from common.errors import EngineError
from common.tiny_lora import make_tiny_lora
from services.worker.engines.vllm.lora import adapter_rank, lora_engine_kwargs
from tests.harness.graph import tiny_model_dir


def test_start_adapters_turn_lora_on_with_a_rank_that_fits(tmp_path) -> None:
    small = make_tiny_lora(tiny_model_dir(), tmp_path / "r8", rank=8)
    big = make_tiny_lora(tiny_model_dir(), tmp_path / "r24", rank=24)
    assert adapter_rank(small) == 8
    assert lora_engine_kwargs(()) == {}
    assert lora_engine_kwargs((("a", str(small)),)) == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert lora_engine_kwargs((("a", str(small)), ("b", str(big)))) == {
        "enable_lora": True, "max_lora_rank": 32, "max_loras": 2}
    with pytest.raises(EngineError, match="not a LoRA adapter"):
        lora_engine_kwargs((("a", str(tmp_path)),))


@pytest.mark.parametrize(("given", "expected"), [
    (None, ()), (["a=/x"], (("a", "/x"),)), (["a=/x", "b=/y"], (("a", "/x"), ("b", "/y"))),
    (["a=/x,b=/y"], (("a", "/x"), ("b", "/y"))), ([" a = /x "], (("a", "/x"),)),
])
def test_lora_modules_option(given, expected) -> None:
    assert lora_modules(given) == expected


@pytest.mark.parametrize("given", [["a"], ["=/x"], ["a="], ["a=/x", "a=/y"]])
def test_lora_modules_option_refuses(given) -> None:
    with pytest.raises(typer.BadParameter):
        lora_modules(given)


def test_the_engine_turns_lora_on_for_its_start_adapters_and_the_users_word_wins(monkeypatch, tmp_path) -> None:
    from tests.services.worker.engines.vllm.test_engine_args import _kwargs

    adapter = str(make_tiny_lora(tiny_model_dir(), tmp_path / "a"))
    assert "enable_lora" not in _kwargs(monkeypatch, False)
    kwargs = _kwargs(monkeypatch, False, lora_modules=(("sql", adapter),))
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 16, 1)
    kwargs = _kwargs(monkeypatch, False, lora_modules=(("sql", adapter),), engine_args={"max_loras": 4})
    assert kwargs["max_loras"] == 4
