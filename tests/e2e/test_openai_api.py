"""The OpenAI API of a real mock-engine graph (frontend, router, prefill and decode workers as processes)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from tests.harness.graph import Graph

MODEL = "tiny"


def client(graph: Graph) -> openai.OpenAI:
    return openai.OpenAI(base_url=graph.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def post(graph: Graph, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(graph.url + path, data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_and_health(mock_pd: Graph) -> None:
    models = client(mock_pd).models.list()
    assert [m.id for m in models.data] == [MODEL]
    with urllib.request.urlopen(mock_pd.url + "/health") as resp:
        assert json.loads(resp.read())["num_decode_workers"] == 1


def test_chat_completion_with_usage(mock_pd: Graph) -> None:
    out = client(mock_pd).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say something about sockets."}], max_tokens=12)
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens > 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_stream(mock_pd: Graph) -> None:
    c = client(mock_pd)
    messages = [{"role": "user", "content": "Stream me a story about queues."}]
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, seed=7)
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, seed=7, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_stream_and_not(mock_pd: Graph) -> None:
    c = client(mock_pd)
    whole = c.completions.create(model=MODEL, prompt="def handler(request):", max_tokens=10, seed=1)
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 10
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="def handler(request):", max_tokens=10, seed=1, stream=True) if ch.choices)
    assert streamed == whole.choices[0].text
    by_ids = c.completions.create(model=MODEL, prompt=[5, 6, 7, 8, 9], max_tokens=3)
    assert by_ids.usage.prompt_tokens == 5 and by_ids.usage.completion_tokens == 3


def test_stop_string_ends_generation(mock_pd: Graph) -> None:
    c = client(mock_pd)
    full = c.completions.create(model=MODEL, prompt="import os\n", max_tokens=40, seed=3).choices[0].text
    stop = full[10:13]
    assert len(stop) == 3
    cut = c.completions.create(model=MODEL, prompt="import os\n", max_tokens=40, seed=3, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 7}, 400, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 17}, 400, "n"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
        ({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 5000}]}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, 400, "max_tokens"),
    ],
)
def test_bad_chat_input_gets_openai_error(mock_pd: Graph, body: dict, status: int, param: str) -> None:
    got, payload = post(mock_pd, "/v1/chat/completions", body)
    assert got == status
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["param"] == param
    # The server keeps serving.
    ok = client(mock_pd).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_malformed_and_oversized_bodies(mock_pd: Graph) -> None:
    got, payload = post(mock_pd, "/v1/chat/completions", b"{not json")
    assert got == 400 and payload["error"]["type"] == "invalid_request_error"
    got, payload = post(mock_pd, "/v1/completions", {"model": MODEL, "prompt": [99999999]})
    assert got == 400 and payload["error"]["param"] == "prompt"
    got, payload = post(mock_pd, "/v1/completions", b"{" + b" " * (9 * 1024 * 1024) + b"}")
    assert got == 413 and payload["error"]["code"] == "body_too_large"
    got, payload = post(mock_pd, "/v1/nothing", {})
    assert got == 404
    assert client(mock_pd).completions.create(model=MODEL, prompt="ok", max_tokens=1).usage.completion_tokens == 1


def test_prompt_over_the_workers_context_is_a_400_naming_it(tmp_path) -> None:
    """Workers whose KV pool holds 8 blocks of 32 tokens serve at most 256 tokens: a longer prompt is the
    client's error (400 with the limit), not a retryable 503 from a worker."""
    import time

    from tests.harness.graph import start_graph

    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "1", "--mock-speedup", "inf",
                        "--num-blocks", "8", "--block-size", "32", "--no-kvtier")
    try:
        deadline = time.monotonic() + 5  # the frontend learns the workers' limits from its next worker poll
        while True:
            status, body = post(graph, "/v1/completions", {"model": MODEL, "prompt": list(range(1, 301)),
                                                           "max_tokens": 4})
            if status == 400 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 400, body
        assert body["error"]["code"] == "context_length_exceeded"
        assert "256 tokens" in body["error"]["message"]
        status, body = post(graph, "/v1/completions", {"model": MODEL, "prompt": list(range(1, 101)), "max_tokens": 4})
        assert status == 200, body
    finally:
        graph.stop()
