"""The prompt vLLM builds: the frontend's conversation and render against transformers' and vLLM's own.

Every case is an OpenAI request body. The frontend's prompt (parse_chat -> message_dicts -> plan_tools ->
ModelTokenizer.apply_chat_template) must be byte-identical (a) between its two renderers (transformers'
render_jinja_template, and the jinja2 environment kept for an image without transformers), and (b) with what
vLLM's own functions build (parse_chat_messages, its tool model's model_dump, safe_apply_chat_template), on the
tiny model's tokenizer and a template that renders tools (tests/harness/chat_templates.py).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from services.frontend import chat_render
from services.frontend.openai_api import check_template_kwargs, message_dicts, parse_chat
from services.frontend.tokenizer import ModelTokenizer
from services.frontend.tools import plan_tools
from tests.harness.chat_templates import TOOLS_TEMPLATE
from tests.harness.graph import tiny_model_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather <b>now</b> & later, in °C — 'quoted'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
BARE = {"type": "function", "function": {"name": "ping"}}
STRICT = {"type": "function", "defer_loading": True, "function": {"name": "add", "strict": True, "parameters": {
    "type": "object", "properties": {"b": {"type": "number"}, "a": {"type": "number"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"days": 2, "city": "Zürich <&>"}'}}
BAD_ARGS = {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "not json"}}
LIST_ARGS = {"id": "call_3", "type": "function", "function": {"name": "ping", "arguments": "[1, 2]"}}
EMPTY_ARGS = {"id": "call_4", "type": "function", "function": {"name": "ping", "arguments": ""}}

USER = {"role": "user", "content": "What is the weather in Zürich?"}
CASES = {
    "plain": {"messages": [USER]},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, USER]},
    "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "one"},
                                                       {"type": "text", "text": "two"}]}]},
    "null content": {"messages": [USER, {"role": "assistant", "content": None}, USER]},
    "multi-turn": {"messages": [USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Sure?"}]},
    "tools": {"messages": [USER], "tools": [WEATHER, BARE, STRICT]},
    "tools + system": {"messages": [{"role": "system", "content": "sys"}, USER], "tools": [WEATHER]},
    "tool call history": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "12 °C"}],
                          "tools": [WEATHER]},
    "odd arguments": {"messages": [USER, {"role": "assistant", "content": "Let me see.",
                                          "tool_calls": [BAD_ARGS, LIST_ARGS, EMPTY_ARGS]},
                                   {"role": "tool", "tool_call_id": "call_2", "content": "a"},
                                   {"role": "tool", "tool_call_id": "call_3", "content": [{"type": "text", "text": "b"},
                                                                                         {"type": "text", "text": "c"}]}],
                      "tools": [BARE]},
    "empty tool_calls": {"messages": [USER, {"role": "assistant", "content": "x", "tool_calls": []}, USER]},
    "many calls break": {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [CALL] * 6}],
                         "tools": [WEATHER]},
    "developer": {"messages": [{"role": "system", "content": "a"}, USER, {"role": "developer", "content": "b"}]},
    "no generation prompt": {"messages": [USER], "add_generation_prompt": False},
    "continue": {"messages": [USER, {"role": "assistant", "content": "It is "}], "add_generation_prompt": False,
                 "continue_final_message": True},
    "kwargs": {"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}},
    "unicode": {"messages": [{"role": "user", "content": "日本語 🙂 \u00e9\u0301 \\n \"q\" </s>"}]},
}


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer(tiny_model_dir(), TOOLS_TEMPLATE)


def frontend_prompt(tok: ModelTokenizer, case: dict, renderer: str = chat_render.RENDERER) -> str:
    body = parse_chat(json.dumps({"model": "m", **case, "tool_choice": "none" if "tools" in case else None}).encode())
    plan = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    tools = plan.template_tools() if plan else None
    messages = message_dicts(body.messages)
    variables = {**chat_render.special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
                 **check_template_kwargs(body.chat_template_kwargs)}
    return chat_render.render(TOOLS_TEMPLATE, chat_render.conversation(messages, TOOLS_TEMPLATE), tools=tools,
                              add_generation_prompt=body.add_generation_prompt,
                              continue_final_message=body.continue_final_message, variables=variables,
                              renderer=renderer)


@pytest.mark.skipif(chat_render._hf_render is None, reason="transformers not installed: one renderer only")
@pytest.mark.parametrize("name", CASES)
def test_both_renderers_give_the_same_prompt_tokens(tokenizer: ModelTokenizer, name: str) -> None:
    via_hf = frontend_prompt(tokenizer, CASES[name], "transformers")
    own = frontend_prompt(tokenizer, CASES[name], "jinja2")
    assert own == via_hf
    assert tokenizer.encode(own) == tokenizer.encode(via_hf)


def test_transformers_tojson_and_loop_controls(tokenizer: ModelTokenizer) -> None:
    for renderer in ("jinja2", "transformers") if chat_render._hf_render else ("jinja2",):
        text = frontend_prompt(tokenizer, CASES["tool call history"], renderer)
        # Keys in the request's order, no HTML escapes, unicode as is; arguments rendered as an object.
        assert '"description": "Weather <b>now</b> & later, in °C — \'quoted\'"' in text
        assert '"arguments": {"days": 2, "city": "Zürich <&>"}' in text
        many = frontend_prompt(tokenizer, CASES["many calls break"], renderer)
        assert many.count("<tool_call>\n") == 4  # {% break %} after four


def test_continue_final_message_and_errors(tokenizer: ModelTokenizer) -> None:
    text = frontend_prompt(tokenizer, CASES["continue"])
    assert text.endswith("<|im_start|>assistant\nIt is ")
    with pytest.raises(chat_render.ChatRenderError):
        frontend_prompt(tokenizer, {**CASES["continue"], "add_generation_prompt": True})
    raising = "{{ raise_exception('no system role here') }}"
    with pytest.raises(chat_render.ChatRenderError, match="no system role"):
        chat_render.render(raising, [], tools=None, add_generation_prompt=True, continue_final_message=False,
                           variables={})
    with pytest.raises(chat_render.ChatRenderError, match="does not compile"):
        chat_render.compile_check("{% for x in %}")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_same_prompt_as_vllms_own_functions(tokenizer: ModelTokenizer) -> None:
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import safe_apply_chat_template
    from vllm.tokenizers import get_tokenizer

    model_dir = str(tiny_model_dir())
    model_config = ModelConfig(model=model_dir, dtype="float32")
    vllm_tok = get_tokenizer(model_dir)
    for name, case in CASES.items():
        conversation, _, _ = parse_chat_messages(json.loads(json.dumps(case["messages"])), model_config, "string")
        tools = [ChatCompletionToolsParam(**t).model_dump() for t in case["tools"]] if "tools" in case else None
        expected = safe_apply_chat_template(
            model_config, vllm_tok, conversation, tools=tools, chat_template=TOOLS_TEMPLATE, tokenize=False,
            add_generation_prompt=case.get("add_generation_prompt", True),
            continue_final_message=case.get("continue_final_message", False), **case.get("chat_template_kwargs", {}))
        ours = tokenizer.apply_chat_template(
            message_dicts(parse_chat(json.dumps({"model": "m", **case}).encode()).messages),
            add_generation_prompt=case.get("add_generation_prompt", True),
            continue_final_message=case.get("continue_final_message", False),
            tools=plan_tools(case.get("tools"), "none" if "tools" in case else None, None).template_tools()
            if "tools" in case else None, template_kwargs=case.get("chat_template_kwargs"))
        assert ours.text == expected, name
        assert ours.token_ids == vllm_tok.encode(expected, add_special_tokens=False), name
