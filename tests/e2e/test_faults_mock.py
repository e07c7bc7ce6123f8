"""Faults on a real graph: a worker killed mid-stream; the request moves to another worker and completes."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.e2e.test_openai_api import MODEL, client
from tests.graph import Graph, child_pid, start_graph, wait_until, worker_stats


@pytest.fixture()
def agg2(tmp_path) -> Graph:
    graph = start_graph(tmp_path, "--engine", "mock", "--aggregated", "2", "--mock-speedup", "10",
                        "--num-blocks", "512", "--router-policy", "round-robin")
    yield graph
    graph.stop()


def test_killed_worker_mid_stream_migrates_and_output_is_unchanged(agg2: Graph) -> None:
    prompt = [200 + i for i in range(300)]
    reference = client(agg2).completions.create(model=MODEL, prompt=prompt, max_tokens=400, seed=5,
                                                extra_body={"ignore_eos": True})
    chunks: list[str] = []
    done = threading.Event()

    def stream() -> None:
        for ch in client(agg2).completions.create(model=MODEL, prompt=prompt, max_tokens=400, seed=5, stream=True,
                                                  extra_body={"ignore_eos": True}):
            if ch.choices:
                chunks.append(ch.choices[0].text)
        done.set()

    thread = threading.Thread(target=stream)
    thread.start()
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
