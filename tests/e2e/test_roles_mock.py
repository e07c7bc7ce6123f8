"""A worker moved between pools in place under streaming load (mock engines, real processes): 1 prefill + 1
decode worker with fixed roles, and a third, switchable one that starts in prefill and is moved to decode with
`splitserve router set-role` while requests stream. No request fails; the prefills it held when it moved are
pulled from it afterwards; new prefills go to the prefill pool only and it decodes with pulled KV."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.harness.graph import REPO, Graph, list_workers, start_graph, tiny_model_dir, wait_until, worker_stats
from cli.ports import free_port
from tests.e2e.test_openai_api import MODEL, client

FLEX = "flex-2"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def graph_and_flex(tmp_path_factory):
    metrics_port = free_port()
    log_dir = tmp_path_factory.mktemp("roles")
    graph = start_graph(log_dir, "--engine", "mock", "--prefill", "1", "--decode", "1", "--fixed-role",
                        # pull, as the standalone flex worker below: the test reads the decode side's pull samples
                        "--kv-transfer", "pull", "--mock-speedup", "4", "--num-blocks", "1024", "--router-metrics-port", str(metrics_port))
    log = open(log_dir / "flex.log", "wb")
    flex = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--model", str(tiny_model_dir()),
                             "--engine", "mock", "--role", "prefill", "--switchable", "--worker-id", FLEX,
                             "--router", graph.router, "--mock-speedup", "4", "--num-blocks", "1024"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: len(asyncio_run_list(graph)) == 3, timeout_s=60), "flex worker did not register"
        yield graph, metrics_port
    finally:
        flex.terminate()
        try:
            flex.wait(timeout=30)
        except subprocess.TimeoutExpired:
            flex.kill()
        log.close()
        graph.stop()


def asyncio_run_list(graph: Graph):
    import asyncio

    return asyncio.run(list_workers(graph.router)).workers


def set_role(graph: Graph, worker_id: str, role: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "router", "set-role", worker_id, role,
                           "--router", graph.router, "--reason", "test"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


class Load:
    """Clients streaming completions of distinct 700-token prompts (remote prefills) back to back."""

    def __init__(self, graph: Graph, num_clients: int) -> None:
        self.graph, self.stop = graph, threading.Event()
        self.results: list[tuple[str, int]] = []  # ("ok" | error text, completion tokens)
        self._lock = threading.Lock()
        self._next = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(num_clients)]

    def _prompt(self) -> list[int]:
        with self._lock:
            self._next += 1
            n = self._next
        return [(n * 7919 + 31 * i) % 7000 + 200 for i in range(700)]

    def _run(self) -> None:
        api = client(self.graph)
        while not self.stop.is_set():
            try:
                stream = api.completions.create(model=MODEL, prompt=self._prompt(), max_tokens=MAX_TOKENS,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True})
                tokens = 0
                for chunk in stream:
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                outcome = ("ok", tokens)
            except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                outcome = (repr(exc), 0)
            with self._lock:
                self.results.append(outcome)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)


def router_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
        return resp.read().decode()


def test_switch_under_streaming_load(graph_and_flex) -> None:
    graph, metrics_port = graph_and_flex
    code, fixed = set_role(graph, "decode-1", "prefill")  # started --fixed-role
    assert code == 1 and not fixed["ok"] and "not switchable" in fixed["reason"]
    with Load(graph, num_clients=6) as load:
        assert wait_until(lambda: any(t.src_worker_id == FLEX for t in worker_stats(graph.router)["decode-1"]
                                      .recent_transfers), timeout_s=30), "flex never prefilled"
        code, answer = set_role(graph, FLEX, "decode")
        switched_at = len(load.results)
        assert code == 0 and answer["ok"] and answer["role"] == "decode", answer
        assert 0 < answer["seconds"] < 1.0
        time.sleep(2.0)  # what was routed before the switch finishes (its KV pulled from flex)
        mark = worker_stats(graph.router)
        time.sleep(4.0)
    done = load.results
    failed = [r for r in done if r[0] != "ok" or r[1] != MAX_TOKENS]
    assert not failed, failed[:5]
    assert len(done) - switched_at >= 12, (switched_at, len(done))  # six streams ran across the switch and after
    end = worker_stats(graph.router)
    # After the switch: every prefill on prefill-0, the moved worker decodes with KV pulled from it.
    new_pulls = [t for wid in ("decode-1", FLEX) for t in end[wid].recent_transfers
                 if t.seq > mark[wid].num_transfers]
    assert new_pulls and {t.src_worker_id for t in new_pulls} == {"prefill-0"}
    assert end[FLEX].num_transfers > mark[FLEX].num_transfers > 0
    assert end[FLEX].num_transfer_failures == 0 and end["decode-1"].num_transfer_failures == 0
    # Visible: the router's list and metrics, the dashboard.
    (info,) = [w for w in asyncio_run_list(graph) if w.worker_id == FLEX]
    assert info.role == "decode" and info.switchable
    text = router_metrics(metrics_port)
    assert re.search(rf'^splitserve_router_worker_role{{role="decode",worker_id="{FLEX}"}} 1\.0$', text, re.M)
    assert not re.search(rf'^splitserve_router_worker_role{{role="prefill",worker_id="{FLEX}"}}', text, re.M)
    assert re.search(r"^splitserve_router_role_switch_seconds_count 1\.0$", text, re.M)
    with urllib.request.urlopen(graph.url + "/dashboard/data") as resp:
        rows = {r["worker_id"]: r for r in json.loads(resp.read())["workers"]}
    assert (rows[FLEX]["role"], rows[FLEX]["switchable"]) == ("decode", True)
    assert (rows["decode-1"]["role"], rows["decode-1"]["switchable"]) == ("decode", False)
