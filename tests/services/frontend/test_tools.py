"""Forced tool calls: the schema that guides them, the calls read back, the shapes the client parses."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.frontend.openai_api import ApiError
from services.frontend.completion_bodies import ResponseShape
from services.frontend.tools import plan_tools, tool_calls

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "description": "now"}}]


def test_named_function_is_guided_by_its_parameters() -> None:
    plan = plan_tools(TOOLS, {"type": "function", "function": {"name": "weather"}}, None)
    assert plan is not None and json.loads(plan.structured.json_schema) == WEATHER
    calls = tool_calls(plan, '{"city":"Oslo"}')
    assert calls is not None and calls[0]["function"] == {"name": "weather", "arguments": '{"city":"Oslo"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert tool_calls(plan, '{"city":"Os') is None  # cut by max_tokens
    # As vLLM's model_dump hands it to the template: unset description/parameters as null, strict left out.
    assert plan.template_tools()[1] == {"type": "function", "function": {"name": "time", "description": "now",
                                                                          "parameters": None}}


def test_required_is_an_array_of_calls_to_any_tool() -> None:
    plan = plan_tools(TOOLS, "required", False)
    schema = json.loads(plan.structured.json_schema)
    answer = [{"name": "weather", "parameters": {"city": "Rome"}}]
    jsonschema.validate(answer, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "nope", "parameters": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):  # parallel_tool_calls false: one call
        jsonschema.validate(answer * 2, schema)
    assert [c["function"]["name"] for c in tool_calls(plan, json.dumps(answer))] == ["weather"]
    assert "maxItems" not in json.loads(plan_tools(TOOLS, "required", None).structured.json_schema)


def test_none_keeps_tools_for_the_template_only() -> None:
    plan = plan_tools(TOOLS, "none", None)
    assert plan is not None and plan.forced is None and plan.structured is None
    assert plan_tools(None, None, None) is None


@pytest.mark.parametrize(("tools", "choice"), [(TOOLS, "auto"), (TOOLS, None), (None, "required"),
                                               (TOOLS, {"type": "function", "function": {"name": "x"}}),
                                               (TOOLS * 2, "required"), ([{"type": "web"}], "required")])
def test_refusals(tools, choice) -> None:
    with pytest.raises(ApiError) as info:
        plan_tools(tools, choice, None)
    assert info.value.status == 400 and info.value.param in ("tools", "tool_choice")


def test_tool_call_shapes() -> None:
    calls = tool_calls(plan_tools(TOOLS, "required", None), '[{"name":"time","parameters":{}}]')
    shape = ResponseShape.chat("chatcmpl-1", "m")
    whole = ChatCompletion.model_validate(orjson.loads(shape.full_response(
        [("", "tool_calls", None, calls)], {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})))
    message = whole.choices[0].message
    assert message.content is None and message.tool_calls[0].function.name == "time"
    assert whole.choices[0].finish_reason == "tool_calls"
    chunk = ChatCompletionChunk.model_validate(orjson.loads(shape.tool_calls_chunk(0, calls)[6:]))
    assert chunk.choices[0].delta.tool_calls[0].function.arguments == "{}"


def test_parser_follows_the_chat_template() -> None:
    from services.frontend.tool_parsers import HERMES, LLAMA3_JSON, parser_for_template

    assert parser_for_template("{% if tools %}<tool_call>{{ t }}</tool_call>{% endif %}") == HERMES
    assert parser_for_template("<|python_tag|>{{ x }}") == LLAMA3_JSON
    assert parser_for_template("{{ '<|im_start|>' + message['content'] }}") is None


@pytest.mark.parametrize(("parser", "text", "content", "calls"), [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Let me look.", [("weather", '{"city":"Oslo"}')]),
    ("hermes", '<tool_call>{"name": "time", "arguments": {}}</tool_call><tool_call>{"name": "weather", '
     '"arguments": {"city": "Rome"}}', "", [("time", "{}"), ("weather", '{"city":"Rome"}')]),  # last unterminated
    ("hermes", "no calls here", "no calls here", None),
    ("hermes", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', None, None),  # not a tool: plain text
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Lima"}}', "", [("weather", '{"city":"Lima"}')]),
    ("llama3_json", '<|python_tag|>{"name": "time", "parameters": {}}; {"name": "time", "parameters": {}}', "",
     [("time", "{}"), ("time", "{}")]),
    ("llama3_json", "The weather is fine.", "The weather is fine.", None),
])
def test_auto_reads_calls_from_the_answer(parser: str, text: str, content: str | None, calls) -> None:
    from services.frontend.tools import tool_answer

    plan = plan_tools(TOOLS, "auto", None, parser)
    assert plan is not None and plan.structured is None and plan.shapes_answer
    got_content, finish, got = tool_answer(plan, text, "stop")
    if calls is None:
        assert (got_content, finish, got) == (text, "stop", None)
    else:
        assert got_content == content and finish == "tool_calls"
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got] == calls


def test_forced_answer_cut_short_stays_text() -> None:
    from services.frontend.tools import tool_answer

    plan = plan_tools(TOOLS, {"type": "function", "function": {"name": "weather"}}, None)
    assert tool_answer(plan, '{"city": "Os', "length") == ('{"city": "Os', "length", None)
    content, finish, calls = tool_answer(plan, '{"city": "Oslo"}', "stop")
    assert (content, finish, calls[0]["function"]["name"]) == ("", "tool_calls", "weather")
