"""Parity with `vllm serve`: vLLM's own OpenAI server and `splitserve up` (aggregated, then 1 prefill + 1 decode)
on the same tiny model (fp32, greedy), the same tool-rendering chat template and vLLM's hermes tool-call parser, sent the same requests
one at a time: every answer must be equal (prompt and completion token counts, text, finish_reason, tool calls).

vLLM's server starts once for the module, each graph once, beside it (vLLM's pinned to the last core). Cases
cover plain chat, unicode, multi-turn, tools (auto / none / a call and its reply in the history), content
parts, developer messages, add_generation_prompt / continue_final_message, chat_template_kwargs, completions,
stop strings, penalties, top_k / min_p, min_tokens, n, and streaming.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random

import httpx
import pytest

from tests.harness.chat_templates import write_tools_template
from tests.harness.graph import start_graph, tiny_model_dir
from tests.harness.vllm_server import start_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]
MODEL = "tiny"
PARSER_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
# The structured-outputs engine setting splitserve's vLLM workers run with (no free whitespace in JSON grammars:
# docs/api.md), given to vLLM's server too.
STRUCTURED_ARGS = ("--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}')
WORDS = ("queue socket block cache prefill decode router worker engine token model kernel Zürich naïve 東京 "
         "🙂 <b> & \"quoted\"").split()
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer"}},
                                                "required": ["city"]}}}
PING = {"type": "function", "function": {"name": "ping"}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}


def _cases() -> dict[str, tuple[str, dict]]:
    """name -> (path, body); deterministic."""
    rng = random.Random(28)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    chat = "/v1/chat/completions"
    cases: dict[str, tuple[str, dict]] = {}
    for i in range(16):
        cases[f"chat-{i}"] = (chat, {"messages": [{"role": "user", "content": text(3 + 4 * i)}], "max_tokens": 6})
    for i in range(6):
        turns = [{"role": "user" if k % 2 == 0 else "assistant", "content": text(5)} for k in range(2 * i + 3)]
        cases[f"multi-turn-{i}"] = (chat, {"messages": turns, "max_tokens": 6})
    cases["system"] = (chat, {"messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": text(8)}], "max_tokens": 6})
    cases["long-prompt"] = (chat, {"messages": [{"role": "user", "content": text(700)}], "max_tokens": 4})
    cases["parts"] = (chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": text(4)},
                                                                      {"type": "text", "text": text(4)}]}],
                             "max_tokens": 6})
    cases["developer"] = (chat, {"messages": [{"role": "user", "content": text(5)},
                                              {"role": "developer", "content": text(3)}], "max_tokens": 6})
    cases["no-generation-prompt"] = (chat, {"messages": [{"role": "user", "content": text(6)}],
                                            "add_generation_prompt": False, "max_tokens": 6})
    cases["continue-final"] = (chat, {"messages": [{"role": "user", "content": text(6)},
                                                   {"role": "assistant", "content": "The " + text(2)}],
                                      "add_generation_prompt": False, "continue_final_message": True,
                                      "max_tokens": 6})
    cases["template-kwargs"] = (chat, {"messages": [{"role": "user", "content": text(6)}],
                                       "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 6})
    for i in range(8):
        cases[f"tools-auto-{i}"] = (chat, {"messages": [{"role": "user", "content": text(4 + i)}],
                                           "tools": [WEATHER, PING][: 1 + i % 2], "max_tokens": 8})
    for i in range(3):
        cases[f"tools-none-{i}"] = (chat, {"messages": [{"role": "user", "content": text(5)}], "tools": [WEATHER],
                                           "tool_choice": "none", "max_tokens": 6})
    for i in range(4):
        history = [{"role": "user", "content": text(5)}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "call_1", "content": text(3 + i)}]
        cases[f"tool-history-{i}"] = (chat, {"messages": history, "tools": [WEATHER], "max_tokens": 8})
    cases["tool-history-text-args"] = (chat, {"messages": [
        {"role": "user", "content": text(4)},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {**CALL, "function": {"name": "ping", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "pong"}], "tools": [PING], "max_tokens": 6})
    sampling = [{"repetition_penalty": 1.3}, {"presence_penalty": 0.8}, {"frequency_penalty": 0.9},
                {"top_k": 1}, {"min_p": 0.5}, {"top_p": 0.01}, {"min_tokens": 5, "max_tokens": 7},
                {"ignore_eos": True, "max_tokens": 10}, {"stop": [" the", "e"]}, {"seed": 7}]
    for i, fields in enumerate(sampling):
        cases[f"sampling-{i}-{'-'.join(fields)}"] = (chat, {"messages": [{"role": "user", "content": text(6)}],
                                                            "max_tokens": 6, **fields})
    for i in range(12):
        cases[f"completion-{i}"] = ("/v1/completions", {"prompt": text(2 + 3 * i), "max_tokens": 6})
    for i in range(5):
        cases[f"completion-stop-{i}"] = ("/v1/completions", {"prompt": text(6), "max_tokens": 12,
                                                             "stop": [rng.choice(["e", "o", " a", "in", "er"])]})
    cases["completion-token-ids"] = ("/v1/completions", {"prompt": [5, 17, 99, 3, 250], "max_tokens": 6})
    cases["completion-n2"] = ("/v1/completions", {"prompt": text(5), "max_tokens": 5, "n": 2})
    for i in range(5):
        cases[f"stream-chat-{i}"] = (chat, {"messages": [{"role": "user", "content": text(5 + i)}], "max_tokens": 6,
                                            "stream": True, "stream_options": {"include_usage": True}})
    cases["stream-tools"] = (chat, {"messages": [{"role": "user", "content": text(5)}], "tools": [WEATHER],
                                    "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}})
    for i in range(3):
        cases[f"stream-completion-{i}"] = ("/v1/completions", {"prompt": text(6 + i), "max_tokens": 6,
                                                               "stream": True,
                                                               "stream_options": {"include_usage": True}})
    cases.update(_field_cases(text))
    return cases


def _field_cases(text) -> dict[str, tuple[str, dict | None]]:
    """vLLM's extra request fields and endpoints (``fields-*``): each compared field by field."""
    chat, completions = "/v1/chat/completions", "/v1/completions"
    user = {"messages": [{"role": "user", "content": text(6)}], "max_tokens": 6}
    special = {"logit_bias": {"1": 100}, "ignore_eos": True, "max_tokens": 4}  # <|im_start|> every step
    grammar = 'root ::= "ab" tail\ntail ::= "c" | "d" tail'
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"]}
    fields: dict[str, tuple[str, dict | None]] = {
        "skip-special-off": (chat, {**user, **special, "skip_special_tokens": False}),
        "no-spaces-between-special": (chat, {**user, **special, "skip_special_tokens": False,
                                             "spaces_between_special_tokens": False}),
        "skip-special-on": (chat, {**user, **special}),
        "include-stop-str": (chat, {**user, "max_tokens": 12, "stop": [" the", "e"],
                                    "include_stop_str_in_output": True}),
        "include-stop-eos": (chat, {**user, "logit_bias": {"2": 100}, "skip_special_tokens": False,
                                    "include_stop_str_in_output": True}),
        "truncate-left": (chat, {"messages": [{"role": "user", "content": text(60)}], "max_tokens": 5,
                                 "truncate_prompt_tokens": 24}),
        "truncate-right": (completions, {"prompt": text(30), "max_tokens": 5, "truncate_prompt_tokens": 7,
                                         "truncation_side": "right"}),
        "allowed-token-ids": (chat, {**user, "allowed_token_ids": [1893, 1406, 1617, 1410, 297, 71, 271]}),
        "bad-words": (chat, {**user, "max_tokens": 10, "bad_words": ["e", " a", "the", "queue"]}),
        "so-regex": (chat, {**user, "structured_outputs": {"regex": "[a-c]{2,5}( [0-9]+)?"}}),
        "so-choice": (chat, {**user, "structured_outputs": {"choice": ["yes", "no", "maybe later"]}}),
        "so-grammar": (completions, {"prompt": text(5), "max_tokens": 8,
                                     "structured_outputs": {"grammar": grammar}}),
        "so-json": (chat, {**user, "max_tokens": 16, "structured_outputs": {"json": schema}}),
        "so-json-object-completion": (completions, {"prompt": text(5), "max_tokens": 8,
                                                    "response_format": {"type": "json_object"}}),
        "echo-completion": (completions, {"prompt": text(5), "max_tokens": 4, "echo": True}),
        "echo-logprobs": (completions, {"prompt": text(5), "max_tokens": 4, "echo": True, "logprobs": 2}),
        "echo-stream": (completions, {"prompt": text(5), "max_tokens": 4, "echo": True, "stream": True}),
        "echo-chat": (chat, {"messages": [{"role": "user", "content": text(4)},
                                          {"role": "assistant", "content": "The " + text(2)}],
                             "add_generation_prompt": False, "continue_final_message": True, "echo": True,
                             "max_tokens": 4}),
        "prompt-logprobs-completion": (completions, {"prompt": text(6), "max_tokens": 3, "prompt_logprobs": 2}),
        "prompt-logprobs-chat": (chat, {**user, "max_tokens": 3, "prompt_logprobs": 1}),
        "logprobs-completion": (completions, {"prompt": text(6), "max_tokens": 4, "logprobs": 2}),
        "logprobs-chat": (chat, {**user, "max_tokens": 4, "logprobs": True, "top_logprobs": 2}),
        "stream-include-stop": (chat, {**user, "max_tokens": 12, "stop": ["e"], "include_stop_str_in_output": True,
                                       "stream": True}),
        "request-id-header": (chat, {**user, "max_tokens": 2, "headers": {"X-Request-Id": "parity-28"}}),
        "request-id-body": (completions, {"prompt": text(3), "max_tokens": 2, "request_id": "parity-body"}),
        "tokenize-prompt": ("/tokenize", {"prompt": text(8), "return_token_strs": True}),
        "tokenize-chat": ("/tokenize", {"messages": [{"role": "user", "content": text(5)}], "tools": [WEATHER]}),
        "detokenize": ("/detokenize", {"tokens": [1, 1893, 1406, 297, 2]}),
        "version": ("/version", None),
        "ping": ("/ping", None),
    }
    return {f"fields-{name}": case for name, case in fields.items()}


CASES = _cases()
# Differences held on purpose, asserted as they are so that a change on either side shows: name -> why.
KNOWN_DIFFERENCES = {
    "completion-n2": "vLLM refuses n > 1 under greedy sampling (400); splitserve answers n equal choices",
}


# 1 prefill + 1 decode beside vLLM's server: three engines on two cores, so a third of the cases (every
# kind among them) rather than all; every prompt is prefilled remotely (--local-prefill-max-tokens 1), and the
# fields that reach the engines (sampling, structured outputs, prompt logprobs, detokenization) all.
PD_FIELDS = ("skip-special-off", "include-stop-eos", "truncate-left", "allowed-token-ids", "bad-words", "so-regex",
             "so-choice", "so-grammar", "so-json", "echo-logprobs", "prompt-logprobs-completion",
             "prompt-logprobs-chat", "logprobs-chat", "stream-include-stop", "request-id-header")
PD_CASES = [name for i, name in enumerate(CASES) if i % 3 == 0 and not name.startswith("fields-")
            or name.startswith(("tool", "stream")) or name.removeprefix("fields-") in PD_FIELDS]
GRAPHS = {"aggregated": ("--aggregated", "1"),
          "pd": ("--prefill", "1", "--decode", "1", "--local-prefill-max-tokens", "1")}


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("parity")


@pytest.fixture(scope="module")
def reference(log_dir):
    """vLLM's own server, started once (and not waited for here: a graph starts beside it)."""
    cores = sorted(os.sched_getaffinity(0))
    server = start_vllm_server(log_dir, tiny_model_dir(), "--chat-template", str(write_tools_template(log_dir)),
                               *PARSER_ARGS, *STRUCTURED_ARGS, core=cores[-1], served_name=MODEL)
    yield server
    server.stop()


def _graph(log_dir, reference, kind: str):
    graph = start_graph(log_dir, "--engine", "vllm", "--dtype", "float32", *GRAPHS[kind],
                        "--chat-template", str(log_dir / "tools.jinja"), *PARSER_ARGS)
    reference.wait_ready()
    return graph


_GRAPHS_UP: list = []  # graphs of this module still running (the P/D fixture stops the aggregated one)


@pytest.fixture(scope="module")
def aggregated(reference, log_dir):
    graph = _graph(log_dir, reference, "aggregated")
    _GRAPHS_UP.append(graph)
    yield graph
    graph.stop()


@pytest.fixture(scope="module")
def pd(reference, log_dir):
    # The aggregated cases ran first (test order): its engine's core goes to the P/D pair.
    while _GRAPHS_UP:
        _GRAPHS_UP.pop().stop()
    graph = _graph(log_dir, reference, "pd")
    yield graph
    graph.stop()


def ask(client: httpx.Client, url: str, path: str, body: dict | None) -> dict:
    """The answer reduced to what must be equal (ids and timestamps differ by nature, unless the client chose
    the id)."""
    if not path.startswith("/v1/"):  # vLLM's utility endpoints: the whole answer
        reply = client.get(url + path) if body is None else client.post(url + path, json={"model": MODEL, **body})
        return {"status": reply.status_code, "body": reply.json() if reply.content else None}
    body = {"model": MODEL, "temperature": 0, **body}
    headers = body.pop("headers", {})
    if not body.get("stream"):
        reply = client.post(url + path, json=body, headers=headers)
        out = reply.json()
        if reply.status_code != 200:
            return {"status": reply.status_code}
        choices = [{"finish_reason": c["finish_reason"], "text": c.get("text"),
                    "content": (c.get("message") or {}).get("content"),
                    "tool_calls": [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                                   for t in (c.get("message") or {}).get("tool_calls") or []],
                    "logprobs": c.get("logprobs"), "prompt_logprobs": c.get("prompt_logprobs")}
                   for c in out["choices"]]
        usage = {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        answer = {"status": 200, "choices": choices, "usage": usage, "prompt_logprobs": out.get("prompt_logprobs")}
        if headers or "request_id" in body:
            answer["id"] = out["id"]
        return answer
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    args: dict[int, str] = {}
    usage = None
    with client.stream("POST", url + path, json=body, headers=headers) as reply:
        if reply.status_code != 200:
            return {"status": reply.status_code}
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk["choices"]:
                delta = c.get("delta") or {}
                texts[c["index"]] = texts.get(c["index"], "") + (delta.get("content") or c.get("text") or "")
                for call in delta.get("tool_calls") or []:
                    args[c["index"]] = args.get(c["index"], "") + (call.get("function") or {}).get("arguments", "")
                if c.get("finish_reason"):
                    finish[c["index"]] = c["finish_reason"]
    usage = usage and {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"status": 200, "texts": texts, "finish": finish, "args": args, "usage": usage}


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


def check(reference_url: str, splitserve_url: str, client: httpx.Client, name: str) -> None:
    path, body = CASES[name]
    expected = ask(client, reference_url, path, body)
    got = ask(client, splitserve_url, path, body)
    if name in KNOWN_DIFFERENCES:
        assert (expected["status"], got["status"]) == (400, 200), KNOWN_DIFFERENCES[name]
        return
    assert expected["status"] == 200, f"vLLM refused {name}: {expected}"
    got, expected = _rounded(got), _rounded(expected)
    assert got == expected, "\n".join(_differences(got, expected))


def _differences(got, expected, at: str = "") -> list[str]:
    """Each leaf where splitserve's answer differs from vLLM's, by path (pytest's own diff cuts nested ones)."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return [d for k in sorted(got.keys() | expected.keys(), key=str)
                for d in _differences(got.get(k, "<absent>"), expected.get(k, "<absent>"), f"{at}.{k}")]
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return [d for i, (a, b) in enumerate(zip(got, expected)) for d in _differences(a, b, f"{at}[{i}]")]
    return [] if got == expected else [f"{at}: splitserve {got!r} vLLM {expected!r}"]


def _rounded(value):
    """Logprobs compared to 3 decimals (the two servers' fp32 sums may differ in the last bits)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize("name", CASES)
def test_aggregated_same_answer_as_vllm_serve(reference, aggregated, client: httpx.Client, name: str) -> None:
    check(reference.url, aggregated.url, client, name)


@pytest.mark.parametrize("name", PD_CASES)
def test_pd_same_answer_as_vllm_serve(reference, pd, client: httpx.Client, name: str) -> None:
    check(reference.url, pd.url, client, name)
