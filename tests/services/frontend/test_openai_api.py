"""Request parsing: every field is honoured or refused with a 400 naming it; sampling fields as SamplingParams."""

from __future__ import annotations

import json

import msgspec
import pytest

from common.protocol import SamplingParams, StructuredOutput
from services.frontend.openai_api import (
    _NO_EFFECT,
    UNSUPPORTED,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_chat,
    parse_completion,
)
from services.frontend.sampling import engines_of, refusal_for_engines, sampling_params
from services.frontend.tools import plan_tools

MESSAGES = [{"role": "user", "content": "hi"}]
EOS = (2,)
VOCAB = 1000

# Fields the frontend reads to serve the request (prompt, limits, streaming) or turns into SamplingParams.
HONOURED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
            "stop", "n", "stream", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
            "ignore_eos", "min_tokens", "repetition_penalty", "stop_token_ids", "logprobs", "top_logprobs",
            "response_format", "tools", "tool_choice", "parallel_tool_calls", "top_k", "min_p",
            "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "echo", "allowed_token_ids",
            "bad_words", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
            "truncate_prompt_tokens", "truncation_side", "prompt_logprobs", "structured_outputs", "request_id"}


def chat(**fields) -> ChatCompletionRequest:
    return parse_chat(json.dumps({"model": "m", "messages": MESSAGES, **fields}).encode())


def params(**fields) -> SamplingParams:
    return sampling_params(chat(**fields), 16, EOS, VOCAB)


def refused(fields: dict, completion: bool = False) -> ApiError:
    with pytest.raises(ApiError) as info:
        if completion:
            req = parse_completion(json.dumps({"model": "m", "prompt": "x", **fields}).encode())
            sampling_params(req, 16, EOS, VOCAB)
        else:
            req = chat(**fields)
            sampling_params(req, 16, EOS, VOCAB, plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls))
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("request_type", [ChatCompletionRequest, CompletionRequest])
def test_every_declared_field_is_honoured_refused_or_without_effect(request_type) -> None:
    # A field added to the request structs must be placed in one of these lists (never silently ignored).
    declared = {f.encode_name for f in msgspec.structs.fields(request_type)}
    assert declared - HONOURED - set(UNSUPPORTED) - set(_NO_EFFECT) == set()


@pytest.mark.parametrize("field", ["guided_json", "top_a", "logprob_token_ids", "use_beam_search"])
def test_unknown_fields_are_refused_by_name(field: str) -> None:
    error = refused({field: 1})
    assert error.param == field and field in error.message and error.code == "unsupported_field"


def test_unknown_nested_field_is_named() -> None:
    assert refused({"stream_options": {"include_usage": True, "chunk_size": 4}}).param == \
        "stream_options"
    assert refused({"messages": [{"role": "user", "content": "x", "audio": {}}]}).param == "messages"


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),  # auto, the default
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": [{"type": "code_interpreter"}], "tool_choice": "required"}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"best_of": 2}, "best_of"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"store": True}, "store"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"messages": [{"role": "tool", "content": "1", "tool_call_id": "c", "output": 1}]}, "messages"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5000": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"min_tokens": 17}, "min_tokens"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
])
def test_refused_with_the_field_named(fields: dict, param: str) -> None:
    assert refused(fields).param == param


@pytest.mark.parametrize(("fields", "param"), [({"suffix": "x"}, "suffix"),
                                               ({"logprobs": 21}, "logprobs"), ({"top_logprobs": 1}, "top_logprobs")])
def test_completion_refusals(fields: dict, param: str) -> None:
    assert refused(fields, completion=True).param == param


def test_accepted_without_effect_and_defaults() -> None:
    p = params(user="u", metadata={"a": "b"}, store=False, tool_choice="none", parallel_tool_calls=True,
               service_tier="auto", prompt_cache_key="k", safety_identifier="s", response_format={"type": "text"})
    assert p == SamplingParams(max_tokens=16, stop_token_ids=EOS)


def test_sampling_fields_reach_the_engine() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    p = params(presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, logit_bias={"7": 100},
               min_tokens=3, stop_token_ids=[9], seed=4, logprobs=True, top_logprobs=3, temperature=0,
               response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema,
                                                                        "strict": True}})
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert p.logit_bias == {7: 100.0} and p.min_tokens == 3 and p.seed == 4 and p.temperature == 0.0
    assert p.stop_token_ids == (2, 9) and p.logprobs == 3
    assert p.structured is not None and json.loads(p.structured.json_schema) == schema
    assert params(response_format={"type": "json_object"}).structured == StructuredOutput(json_object=True)
    assert params(logprobs=True).logprobs == 0 and params().logprobs is None
    # ignore_eos drops the model's end ids but keeps the user's.
    assert params(ignore_eos=True, stop_token_ids=[9]).stop_token_ids == (9,)
    # vLLM's top_k and min_p; -1 and 0 both mean every token (vLLM).
    assert (params(top_k=5, min_p=0.1).top_k, params(top_k=5, min_p=0.1).min_p) == (5, 0.1)
    assert params(top_k=-1).top_k == 0 == params(top_k=0).top_k
    completion = parse_completion(b'{"model": "m", "prompt": "x", "logprobs": 2}')
    assert sampling_params(completion, 16, EOS, VOCAB).logprobs == 2


@pytest.mark.parametrize(("fields", "engines", "param"), [
    ({"presence_penalty": 0.5}, {"mock"}, "presence_penalty"),
    ({"frequency_penalty": 0.5}, {"mock", "vllm"}, "frequency_penalty"),
    ({"repetition_penalty": 1.1}, {"mock"}, "repetition_penalty"),
    ({"response_format": {"type": "json_object"}}, {"mock"}, "response_format"),
    ({"presence_penalty": 0.5, "response_format": {"type": "json_object"}}, {"vllm"}, None),
    ({"logit_bias": {"3": 5}, "min_tokens": 2, "logprobs": True}, {"mock"}, None),
])
def test_engine_kinds_refuse_what_they_cannot_honour(fields: dict, engines: set[str], param: str | None) -> None:
    refusal = refusal_for_engines(params(**fields), engines)
    assert (refusal.param if refusal else None) == param


def test_engines_of_the_model() -> None:
    from common.protocol import WorkerInfo, WorkerList

    def info(i: int, model: str, engine: str) -> WorkerInfo:
        return WorkerInfo(worker_id=str(i), role="both", model=model, block_size=16, num_blocks=1,
                          endpoint="tcp://x", engine=engine)

    listed = WorkerList(request_id="r", workers=(info(1, "m", "vllm"), info(2, "other", "mock")), loads=())
    assert engines_of(listed, "m") == {"vllm"} and engines_of(None, "m") == set()


def test_chat_template_kwargs_add_variables_but_cannot_replace_the_request() -> None:
    from services.frontend.openai_api import check_template_kwargs

    assert check_template_kwargs(chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs) == {
        "enable_thinking": False}
    assert check_template_kwargs(None) == {}
    with pytest.raises(ApiError) as info:
        check_template_kwargs(chat(chat_template_kwargs={"messages": [], "tools": []}).chat_template_kwargs)
    assert info.value.status == 400 and info.value.param == "chat_template_kwargs"
    assert "messages, tools" in str(info.value)
