"""Sampling controls and logprobs through a mock-engine graph with the official client: honoured alike on the
prefill and the decode side (P/D equals aggregated), streamed equals whole, and what the mock cannot honour
is a 400 naming the field."""

from __future__ import annotations

import math

import openai
import pytest
from tokenizers import Tokenizer

from tests.harness.graph import Graph, tiny_model_dir
from tests.e2e.test_disaggregation_mock import metric
from tests.e2e.test_openai_api import MODEL, client

# Above the local-prefill threshold (256): the P/D graph prefills these remotely.
LONG = [(37 * i) % 7000 + 500 for i in range(400)]
REMOTE = 'splitserve_frontend_prefill_decisions_total{where="remote"}'


def token_text(token_id: int) -> str:
    return Tokenizer.from_file(str(tiny_model_dir() / "tokenizer.json")).decode([token_id])


def completion(graph: Graph, prompt: list[int], stream: bool = False, **fields):
    c = client(graph)
    if not stream:
        out = c.completions.create(model=MODEL, prompt=prompt, **fields)
        lp = out.choices[0].logprobs
        return out.choices[0].text, out.choices[0].finish_reason, lp and (lp.tokens, lp.token_logprobs,
                                                                           lp.top_logprobs, lp.text_offset)
    text, finish, parts = "", None, ([], [], [], [])
    for chunk in c.completions.create(model=MODEL, prompt=prompt, stream=True, **fields):
        choice = chunk.choices[0]
        text += choice.text
        finish = choice.finish_reason or finish
        if choice.logprobs is not None:
            for part, values in zip(parts, (choice.logprobs.tokens, choice.logprobs.token_logprobs,
                                            choice.logprobs.top_logprobs, choice.logprobs.text_offset)):
                part.extend(values)
    return text, finish, parts if parts[0] else None


def test_logit_bias_makes_every_token_that_token(mock_pd: Graph) -> None:
    remote = metric(mock_pd, REMOTE)
    text, finish, _ = completion(mock_pd, LONG, max_tokens=8, logit_bias={"1234": 100}, seed=5)
    assert text == token_text(1234) * 8 and finish == "length"
    assert metric(mock_pd, REMOTE) == remote + 1  # the first token came from the prefill worker, biased too


def test_a_token_that_decodes_to_no_text_still_streams_its_chunk(mock_pd: Graph) -> None:
    # Byte 0xA0 alone is not UTF-8: the detokenizer holds it back and each token's text is "". vLLM still streams
    # a chunk per token; splitserve sent none, so a client saw nothing until the finish (and timed it as one gap).
    assert token_text(100) == "\ufffd"
    chunks = list(client(mock_pd).completions.create(model=MODEL, prompt=LONG, max_tokens=5, stream=True,
                                                     logit_bias={"100": 100}, seed=5))
    tokens = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert [c.text for c in tokens] == [""] * 5
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_controls_and_logprobs_pd_equals_aggregated_streamed_equals_whole(mock_pd: Graph, mock_agg: Graph) -> None:
    plain, _, _ = completion(mock_agg, LONG[1:], max_tokens=12, seed=9)
    fields = {"max_tokens": 12, "seed": 9, "logprobs": 3, "logit_bias": {"77": 100, "78": -100},
              "extra_body": {"min_tokens": 5, "stop_token_ids": [77]}}
    pd = completion(mock_pd, LONG[1:], **fields)
    agg = completion(mock_agg, LONG[1:], **fields)
    assert pd == agg
    assert completion(mock_pd, LONG[1:], stream=True, **fields) == pd
    assert completion(mock_agg, LONG[1:], stream=True, **fields) == agg
    text, finish, (tokens, values, tops, offsets) = pd
    # Token 77 is biased to win but is a stop id: masked for min_tokens (5) outputs, then it ends the answer.
    assert finish == "stop" and len(tokens) == 6 and tokens[-1] == token_text(77)
    assert text == "".join(tokens[:-1]) and text != plain
    assert all(math.isfinite(v) and v <= 0 for v in values)
    assert all(len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True) for top in tops)
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_chat_logprobs_streamed_equals_whole(mock_pd: Graph) -> None:
    c = client(mock_pd)
    messages = [{"role": "user", "content": "Count the queues. " * 60}]
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=3, logprobs=True,
                                      top_logprobs=4)
    content = whole.choices[0].logprobs.content
    assert len(content) == 10 and "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(len(t.top_logprobs) == 4 and t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
               and math.isfinite(t.logprob) for t in content)
    streamed = [entry for chunk in c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                                             seed=3, logprobs=True, top_logprobs=4, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]
    plain = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=3)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


@pytest.mark.parametrize(("fields", "param"), [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"extra_body": {"repetition_penalty": 1.1}}, "repetition_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "tool_choice": "required"}, "tool_choice"),  # guided decoding: not on the mock
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),  # auto: no parser
    ({"tool_choice": "required"}, "tool_choice"),
    ({"n": 17}, "n"),
    ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
])
def test_what_the_mock_cannot_honour_is_a_400_naming_it(mock_agg: Graph, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(mock_agg).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, **fields)
    assert info.value.status_code == 400 and info.value.body["param"] == param


def test_n_choices_prefill_once_and_pull_once(mock_pd: Graph) -> None:
    from tests.harness.graph import worker_stats

    c = client(mock_pd)
    prompt = [(41 * i) % 7000 + 300 for i in range(400)]
    remote, local = metric(mock_pd, REMOTE), metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="local"}')
    pulls = sum(s.num_transfers for s in worker_stats(mock_pd.router).values())
    out = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, seed=4, n=3, logprobs=1)
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    assert len({ch.text for ch in out.choices}) == 3  # seed + index per choice
    assert all(len(ch.logprobs.tokens) == 6 for ch in out.choices)
    # One prefill on the prefill worker and one KV pull; the other choices prefill on the decode worker.
    assert metric(mock_pd, REMOTE) == remote + 1
    assert metric(mock_pd, 'splitserve_frontend_prefill_decisions_total{where="local"}') == local + 2
    assert sum(s.num_transfers for s in worker_stats(mock_pd.router).values()) == pulls + 1
    single = c.completions.create(model=MODEL, prompt=prompt, max_tokens=6, seed=4)
    assert out.choices[0].text == single.choices[0].text
    assert out.usage.prompt_tokens == single.usage.prompt_tokens and out.usage.completion_tokens == 18
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "n " * 300}],
                                           max_tokens=5, seed=4, n=3, stream=True):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            finishes[ch.index] = ch.finish_reason or finishes.get(ch.index)
    whole = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "n " * 300}],
                                      max_tokens=5, seed=4, n=3)
    assert texts == {ch.index: ch.message.content for ch in whole.choices}
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_responses_endpoint_whole_and_streamed(mock_pd: Graph) -> None:
    c = client(mock_pd)
    request = {"model": MODEL, "input": "Tell me about queues. " * 40, "instructions": "Be brief.",
               "max_output_tokens": 9, "temperature": 0}
    whole = c.responses.create(**request)
    chat = c.chat.completions.create(model=MODEL, max_tokens=9, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": request["input"]}])
    assert whole.output_text == chat.choices[0].message.content and whole.status == "incomplete"
    assert whole.usage.input_tokens == chat.usage.prompt_tokens and whole.usage.output_tokens == 9
    events = list(c.responses.create(**request, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert info.value.body["param"] == "previous_response_id"


def test_tool_choice_none_answers_in_text_and_tool_history_is_accepted(mock_agg: Graph) -> None:
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    out = client(mock_agg).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, tool_choice="none",
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}])
    assert out.choices[0].message.content and out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason == "length"


def test_continuous_usage_stats_as_the_bench_asks(mock_agg: Graph) -> None:
    usages = [chunk.usage.completion_tokens for chunk in client(mock_agg).completions.create(
        model=MODEL, prompt=[5, 6, 7], max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "min_tokens": 5}) if chunk.usage is not None]
    assert usages[:-1] == sorted(usages[:-1]) and usages[-1] == 5 and len(usages) >= 5
