"""The OpenAI fields on the real path: a vLLM prefill worker -> NIXL -> vLLM decode worker graph (tiny model,
fp32), driven with the official client. One graph for the whole module (vLLM engines are slow to start here).

Structured outputs are guided on both sides: the prefill worker's first token comes from the grammar, and the
decode engine's grammar advances over it (forced) before it samples the rest. "Aggregated" here is the same
request served again once the decode worker holds the prompt: it then prefills locally (no prefill worker,
no pull), so every field is compared between the split and the one-engine path under greedy decoding.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random

import jsonschema
import pytest

from tests.harness.graph import Graph, start_graph
from tests.e2e.test_disaggregation_mock import metric
from tests.e2e.test_openai_api import MODEL, client

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
REMOTE = 'splitserve_frontend_prefill_decisions_total{where="remote"}'
LOCAL = 'splitserve_frontend_prefill_decisions_total{where="local"}'
WORDS = "queue socket block cache prefill decode router worker engine token model kernel".split()


@pytest.fixture(scope="module")
def vllm_pd(tmp_path_factory) -> Graph:
    graph = start_graph(tmp_path_factory.mktemp("vllm-api"), "--engine", "vllm", "--dtype", "float32",
                        "--local-prefill-max-tokens", "32", "--prefill", "1", "--decode", "1", "--kv-transfer", "pull")
    yield graph
    graph.stop()


def message(rng: random.Random, num_words: int = 60) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(num_words))}]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A strict object schema: every property required, none extra; scalars bounded so a random model's
    greedy choice cannot run on forever inside a string or a number."""
    kinds = ["boolean", "null", "integer", "enum", "string", "array"] + (["object"] if depth < 2 else [])
    props = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(kinds)
        if kind == "integer":
            props[f"n{i}"] = {"type": "integer", "minimum": 0, "maximum": rng.choice([9, 99, 999])}
        elif kind == "enum":
            props[f"e{i}"] = {"type": "string", "enum": rng.sample(["red", "green", "blue", "amber"], 3)}
        elif kind == "string":
            props[f"s{i}"] = {"type": "string", "minLength": 1, "maxLength": rng.randint(1, 6)}
        elif kind == "array":
            props[f"a{i}"] = {"type": "array", "items": {"type": rng.choice(["boolean", "null"])},
                              "minItems": 1, "maxItems": 3}
        elif kind == "object":
            props[f"o{i}"] = random_schema(rng, depth + 1)
        else:
            props[f"{kind[0]}{i}"] = {"type": kind}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def test_json_schema_outputs_parse_and_validate(vllm_pd: Graph) -> None:
    rng = random.Random(21)
    c = client(vllm_pd)
    remote, local = metric(vllm_pd, REMOTE), metric(vllm_pd, LOCAL)
    first = None
    for i in range(20):
        schema = random_schema(rng)
        request = {"model": MODEL, "messages": message(rng), "max_tokens": 200, "temperature": 0,
                   "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema,
                                                                              "strict": True}}}
        out = c.chat.completions.create(**request)
        content = out.choices[0].message.content
        assert out.choices[0].finish_reason == "stop", f"schema {i} {schema}: unfinished {content!r}"
        jsonschema.validate(json.loads(content), schema)
        first = first or (request, content)
    # Every one went prefill -> decode (a guided first token on the prefill worker, the rest on decode).
    assert metric(vllm_pd, REMOTE) == remote + 20 and metric(vllm_pd, LOCAL) == local
    # The first again, now prefilled on the decode worker (it holds the prompt): the same JSON.
    again = c.chat.completions.create(**first[0])
    assert again.choices[0].message.content == first[1] and metric(vllm_pd, LOCAL) == local + 1
    # Any JSON object: the grammar holds from the first (prefill) token on. An unbounded string lets a random
    # model run to max_tokens, so only a finished answer must parse.
    anything = c.chat.completions.create(model=MODEL, messages=message(rng), max_tokens=60, temperature=0,
                                         response_format={"type": "json_object"})
    content = anything.choices[0].message.content
    assert content.startswith("{") and not content[1:2].isspace()
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_logit_bias_makes_every_token_that_token(vllm_pd: Graph) -> None:
    out = client(vllm_pd).completions.create(model=MODEL, prompt=[(31 * i) % 7000 + 300 for i in range(80)],
                                             max_tokens=8, logit_bias={"1234": 100}, logprobs=0,
                                             extra_body={"ignore_eos": True})
    assert out.choices[0].logprobs.tokens == [out.choices[0].logprobs.tokens[0]] * 8
    from tokenizers import Tokenizer

    from tests.harness.graph import tiny_model_dir

    tok = Tokenizer.from_file(str(tiny_model_dir() / "tokenizer.json"))
    assert out.choices[0].text == tok.decode([1234] * 8)


def _completion(graph: Graph, prompt: list[int], stream: bool, **fields):
    c = client(graph)
    if not stream:
        out = c.completions.create(model=MODEL, prompt=prompt, **fields)
        lp = out.choices[0].logprobs
        return out.choices[0].text, out.usage.completion_tokens, lp.tokens, lp.token_logprobs, lp.top_logprobs
    text, tokens, values, tops, usage = "", [], [], [], 0
    for chunk in c.completions.create(model=MODEL, prompt=prompt, stream=True,
                                      stream_options={"include_usage": True}, **fields):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                values += choice.logprobs.token_logprobs
                tops += choice.logprobs.top_logprobs
    return text, usage, tokens, values, tops


def _close(a, b) -> bool:
    text_a, n_a, tokens_a, values_a, tops_a = a
    text_b, n_b, tokens_b, values_b, tops_b = b
    return ((text_a, n_a, tokens_a) == (text_b, n_b, tokens_b)
            and all(math.isclose(x, y, abs_tol=1e-3) for x, y in zip(values_a, values_b))
            and [list(t) for t in tops_a] == [list(t) for t in tops_b])


def test_disaggregated_equals_local_for_every_field(vllm_pd: Graph) -> None:
    prompt = [(53 * i) % 7000 + 200 for i in range(96)]
    fields = {"max_tokens": 12, "temperature": 0, "logprobs": 3, "presence_penalty": 0.6,
              "frequency_penalty": 0.4, "logit_bias": {"500": 4.0, "501": -100},
              "extra_body": {"repetition_penalty": 1.3, "min_tokens": 6, "ignore_eos": True}}
    remote, local = metric(vllm_pd, REMOTE), metric(vllm_pd, LOCAL)
    split = _completion(vllm_pd, prompt, False, **fields)
    assert metric(vllm_pd, REMOTE) == remote + 1
    again = _completion(vllm_pd, prompt, False, **fields)
    streamed = _completion(vllm_pd, prompt, True, **fields)
    assert metric(vllm_pd, LOCAL) == local + 2, "the repeated prompt should prefill on the decode worker"
    assert _close(split, again) and _close(split, streamed)
    _, num, tokens, values, tops = split
    assert num == 12 and len(tokens) == 12
    assert all(math.isfinite(v) and v <= 0 for v in values)
    assert all(len(t) == 3 and list(t.values()) == sorted(t.values(), reverse=True) for t in tops)
    # The penalties change the answer (they reached the engine on both sides).
    plain = client(vllm_pd).completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True})
    assert plain.choices[0].text != split[0]


def test_n_choices_share_one_prefill_and_one_pull(vllm_pd: Graph) -> None:
    from tests.harness.graph import worker_stats

    prompt = [(71 * i) % 7000 + 250 for i in range(90)]
    pulls = worker_stats(vllm_pd.router)["decode-1"].num_transfers
    remote, local = metric(vllm_pd, REMOTE), metric(vllm_pd, LOCAL)
    out = client(vllm_pd).completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, n=3,
                                             extra_body={"ignore_eos": True})
    # Greedy: every choice is the same answer, the one a single request gets.
    assert [ch.index for ch in out.choices] == [0, 1, 2] and len({ch.text for ch in out.choices}) == 1
    assert out.usage.completion_tokens == 24 and out.usage.prompt_tokens == 90
    assert (metric(vllm_pd, REMOTE), metric(vllm_pd, LOCAL)) == (remote + 1, local + 2)
    assert worker_stats(vllm_pd.router)["decode-1"].num_transfers == pulls + 1


def test_forced_tool_calls_have_arguments_valid_for_their_schema(vllm_pd: Graph) -> None:
    rng = random.Random(7)
    c = client(vllm_pd)
    params = random_schema(rng)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": params}},
             {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {},
                                                                             "additionalProperties": False}}}]
    named = {"type": "function", "function": {"name": "lookup"}}
    request = {"model": MODEL, "messages": message(rng), "max_tokens": 200, "temperature": 0, "tools": tools}
    whole = c.chat.completions.create(**request, tool_choice=named)
    call = whole.choices[0].message.tool_calls[0]
    assert whole.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"
    jsonschema.validate(json.loads(call.function.arguments), params)
    streamed = [d for chunk in c.chat.completions.create(**request, tool_choice=named, stream=True)
                for ch in chunk.choices if ch.delta and ch.delta.tool_calls for d in ch.delta.tool_calls]
    assert [(d.function.name, d.function.arguments) for d in streamed] == [("lookup", call.function.arguments)]
    required = c.chat.completions.create(**request, tool_choice="required", parallel_tool_calls=False)
    calls = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    schema = params if calls[0].function.name == "lookup" else tools[1]["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
