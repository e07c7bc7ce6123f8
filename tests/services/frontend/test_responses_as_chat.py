"""/v1/responses: the request as a chat completion, the Response object and its events as the client parses them."""

from __future__ import annotations

import json

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from services.frontend.openai_api import ApiError
from services.frontend.responses_as_chat import ResponsesShape, parse_responses

USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}


def parse(**fields):
    return parse_responses(json.dumps({"model": "m", "input": "hi", **fields}).encode())


def test_maps_onto_a_chat_completion() -> None:
    schema = {"type": "object", "properties": {}}
    _, chat = parse(instructions="be brief", max_output_tokens=7, temperature=0.5,
                    input=[{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
                           {"role": "assistant", "content": "c"}],
                    text={"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": True}})
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"), ("user", "ab"), ("assistant", "c")]
    assert chat.max_completion_tokens == 7 and chat.temperature == 0.5
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.schema == schema
    assert [(m.role, m.content) for m in parse()[1].messages] == [("user", "hi")]


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"store": True}, "store"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"frobnicate": 1}, "frobnicate"),
])
def test_refusals_name_the_field(fields: dict, param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert info.value.status == 400 and info.value.param == param


def test_response_whole_and_streamed() -> None:
    req, _ = parse(max_output_tokens=2)
    whole = Response.model_validate(orjson.loads(ResponsesShape("resp_1", req).full_response(
        [("Hi!", "length", None)], USAGE)))
    assert whole.output_text == "Hi!" and whole.status == "incomplete" and whole.usage.input_tokens == 3
    assert whole.incomplete_details.reason == "max_output_tokens"
    shape = ResponsesShape("resp_2", req)
    raw = shape.first_chunk() + shape.delta_chunk("Hi") + shape.delta_chunk("!") + shape.final_chunks(["stop"], USAGE)
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(orjson.loads(block.split(b"\ndata: ", 1)[1]))
              for block in raw.split(b"\n\n") if block]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(10))
    assert events[-1].response.output_text == "Hi!" and events[-1].response.usage.output_tokens == 2
