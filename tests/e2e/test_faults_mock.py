"""Faults on a real graph: a worker killed mid-stream; the request moves to another worker and completes."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.harness.graph import Graph, child_pid, start_graph, wait_until, worker_stats
from tests.e2e.test_openai_api import MODEL, client


@pytest.fixture()
def agg2(tmp_path) -> Graph:
    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "2", "--mock-speedup", "10",
                        "--num-blocks", "512", "--router-policy", "round-robin")
    yield graph
    graph.stop()


def stream_in_background(graph: Graph, prompt: list[int], max_tokens: int,
                         seed: int) -> tuple[list[str], threading.Event, threading.Thread]:
    """Stream a completion on a thread; returns the growing list of text chunks and an event set at the end."""
    chunks: list[str] = []
    done = threading.Event()

    def stream() -> None:
        for ch in client(graph).completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, seed=seed,
                                                   stream=True, extra_body={"ignore_eos": True}):
            if ch.choices:
                chunks.append(ch.choices[0].text)
        done.set()

    thread = threading.Thread(target=stream)
    thread.start()
    return chunks, done, thread


def test_killed_worker_mid_stream_migrates_and_output_is_unchanged(agg2: Graph) -> None:
    prompt = [200 + i for i in range(300)]
    reference = client(agg2).completions.create(model=MODEL, prompt=prompt, max_tokens=400, seed=5,
                                                extra_body={"ignore_eos": True})
    chunks, done, thread = stream_in_background(agg2, prompt, max_tokens=400, seed=5)
    assert wait_until(lambda: len(chunks) > 30, timeout_s=10)
    busy = [w for w, s in worker_stats(agg2.router).items() if s.load.num_running > 0]
    assert len(busy) == 1
    os.kill(child_pid(agg2, f"--worker-id {busy[0]}"), signal.SIGKILL)
    assert done.wait(30), "the stream never finished"
    thread.join()
    assert "".join(chunks) == reference.choices[0].text
    # The survivor (and the restarted worker, once back) hold no blocks.
    assert wait_until(lambda: all(s.load.num_free_blocks == 512 for s in worker_stats(agg2.router).values()), 5)
    assert agg2.alive()  # the launcher restarted the killed worker instead of giving up


@pytest.fixture()
def pd(tmp_path) -> Graph:
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "1", "--mock-speedup", "10",
                        "--num-blocks", "512", "--no-kvtier")
    yield graph
    graph.stop()


@pytest.fixture()
def pd2(tmp_path) -> Graph:
    graph = start_graph(tmp_path, "--engine", "mock", "--prefill", "1", "--decode", "2", "--mock-speedup", "10",
                        "--num-blocks", "512", "--no-kvtier")
    yield graph
    graph.stop()


def test_killed_decode_worker_mid_stream_resumes_after_a_new_handoff(pd2: Graph) -> None:
    """P/D: the request resumes from what was streamed (a prompt no decode worker holds then: prefilled remotely
    again and handed off a second time, its budget what is left); the client sees the one answer."""
    prompt = [900 + i for i in range(600)]  # long: a remote prefill, the first time and after the move
    chunks, done, thread = stream_in_background(pd2, prompt, max_tokens=300, seed=6)
    assert wait_until(lambda: len(chunks) > 30, timeout_s=10)
    stats = worker_stats(pd2.router)
    busy = [w for w, s in stats.items() if w.startswith("decode") and s.load.num_running > 0]
    assert len(busy) == 1
    os.kill(child_pid(pd2, f"--worker-id {busy[0]}"), signal.SIGKILL)
    assert done.wait(30), "the stream never finished"
    thread.join()
    after = worker_stats(pd2.router)
    # One more pull in all, on the survivor or on the killed worker's restart: the resumed prompt's hand-off.
    pulls = sum(s.num_transfers for w, s in after.items() if w.startswith("decode"))
    assert pulls - sum(s.num_transfers for w, s in stats.items() if w.startswith("decode") and w not in busy) == 1
    reference = client(pd2).completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=6,
                                               extra_body={"ignore_eos": True})
    assert "".join(chunks) == reference.choices[0].text and reference.usage.completion_tokens == 300


def test_killed_router_streams_continue_and_service_recovers(pd: Graph) -> None:
    prompt = [300 + i for i in range(400)]
    reference = client(pd).completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=9,
                                              extra_body={"ignore_eos": True}).choices[0].text
    chunks, done, thread = stream_in_background(pd, prompt, max_tokens=300, seed=9)
    assert wait_until(lambda: len(chunks) > 20, timeout_s=10)
    os.kill(child_pid(pd, "cli.main router"), signal.SIGKILL)
    assert done.wait(30)
    thread.join()
    # Tokens never pass through the router: the stream finished untouched.
    assert "".join(chunks) == reference
    # The launcher restarts the router; workers re-register; new requests are served again.
    assert wait_until(lambda: len(worker_stats(pd.router)) == 2, timeout_s=15)
    again = client(pd).completions.create(model=MODEL, prompt=prompt, max_tokens=300, seed=9,
                                          extra_body={"ignore_eos": True})
    assert again.choices[0].text == reference


def test_killed_prefill_worker_is_routed_around(pd: Graph) -> None:
    prompt = [700 + i for i in range(600)]  # long: remote prefill while the prefill worker lives
    reference = client(pd).completions.create(model=MODEL, prompt=prompt, max_tokens=20, seed=4).choices[0].text
    os.kill(child_pid(pd, "--worker-id prefill-0"), signal.SIGKILL)
    # The next long prompts still complete with the same output: prefilled on the decode worker meanwhile.
    for salt in range(3):
        other = [t + salt for t in prompt]
        out = client(pd).completions.create(model=MODEL, prompt=other, max_tokens=20, seed=4)
        assert out.usage.completion_tokens == 20
    assert client(pd).completions.create(model=MODEL, prompt=prompt, max_tokens=20,
                                         seed=4).choices[0].text == reference
    assert wait_until(lambda: all(s.load.num_running == 0 for s in worker_stats(pd.router).values()), 10)


def test_killed_frontend_frees_its_requests_and_is_restarted(pd: Graph) -> None:
    """The worker notices the requester is gone at its next token and frees the blocks at once, instead of
    generating for nobody until max_tokens; the launcher restarts the frontend, which serves again."""
    prompt = [500 + i for i in range(400)]
    # 3,500 tokens at speedup 10: ~10 s of decoding if nobody stopped it.
    chunks, _, _ = stream_in_background(pd, prompt, max_tokens=3500, seed=2)
    assert wait_until(lambda: len(chunks) > 20, timeout_s=10)
    assert worker_stats(pd.router)["decode-1"].load.num_running == 1
    os.kill(child_pid(pd, "cli.main frontend"), signal.SIGKILL)
    assert wait_until(lambda: all(s.load.num_running == 0 and s.load.num_free_blocks == 512
                                  for s in worker_stats(pd.router).values()), timeout_s=3)
    assert "requester_gone" in pd.logs()
    assert wait_until(lambda: _serves(pd), timeout_s=20)


def _serves(graph: Graph) -> bool:
    try:
        out = client(graph).completions.create(model=MODEL, prompt=[42] * 10, max_tokens=3)
    except Exception:
        return False
    return out.usage.completion_tokens == 3
