"""vLLM's own tool-call and reasoning parsers behind --tool-call-parser / --reasoning-parser (vllm_parsers.py):
the whole answer and the streamed deltas split as vLLM splits them, on the tiny model's tokenizer."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests.harness.graph import tiny_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}).encode()
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def streamed(parsers, session, text: str) -> list[dict]:
    """Token by token, each step's text as the detokenizer gives it."""
    ids = parsers.tokenizer.encode(text, add_special_tokens=False)
    deltas, before = [], ""
    for i in range(len(ids)):
        now = parsers.tokenizer.decode(ids[: i + 1])
        if (delta := session.stream(now[len(before):], [ids[i]])) is not None:
            deltas.append(delta)
        before = now
    return deltas


@pytest.fixture(scope="module")
def think_model(tmp_path_factory) -> Path:
    """The tiny model's tokenizer with <think> and </think> added (reasoning parsers look them up)."""
    from tokenizers import Tokenizer

    out = tmp_path_factory.mktemp("think")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json"):
        shutil.copy(tiny_model_dir() / name, out / name)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_tokens(["<think>", "</think>"])
    tok.save(str(out / "tokenizer.json"))
    return out


def test_hermes_whole_and_streamed() -> None:
    from services.frontend.vllm_parsers import VllmParsers

    parsers = VllmParsers(tiny_model_dir(), "hermes", None)
    request = parsers.request(BODY)
    answer = parsers.session(request, True).whole("Sure. " + CALL)
    assert answer.content == "Sure. " and answer.reasoning is None
    assert [c["function"] for c in answer.tool_calls] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    session = parsers.session(request, True)
    deltas = streamed(parsers, session, "Sure. " + CALL)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert "".join(d.get("content", "") for d in deltas) == "Sure. "
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert len(calls) > 2  # incremental: the arguments come in several deltas, not in one piece at the end
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"city": "Oslo"}
    assert session.called
    plain = parsers.session(request, True)
    assert "".join(d.get("content", "") for d in streamed(parsers, plain, "No call here.")) == "No call here."
    assert not plain.called and parsers.session(request, True).whole("No call.").tool_calls is None


def test_reasoning_split_whole_and_streamed(think_model: Path) -> None:
    from services.frontend.vllm_parsers import VllmParsers

    parsers = VllmParsers(think_model, None, "deepseek_r1")
    request = parsers.request(BODY)
    answer = parsers.session(request, False).whole("<think>cold, maybe</think>It is cold.")
    assert (answer.reasoning, answer.content) == ("cold, maybe", "It is cold.")
    deltas = streamed(parsers, parsers.session(request, False), "<think>cold, maybe</think>It is cold.")
    assert "".join(d.get("reasoning", "") for d in deltas) == "cold, maybe"
    assert "".join(d.get("content", "") for d in deltas) == "It is cold."


def test_unknown_parser_and_missing_think_tokens_fail_at_start() -> None:
    from services.frontend.vllm_parsers import ParserError, VllmParsers

    with pytest.raises(ParserError, match="hermes"):  # the message lists vLLM's parsers
        VllmParsers(tiny_model_dir(), "no-such-parser", None)
    with pytest.raises(ParserError, match="think"):
        VllmParsers(tiny_model_dir(), None, "deepseek_r1")
