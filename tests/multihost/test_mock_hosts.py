"""Mock engines on separate hosts: frontend + router on A, prefill on B, decode on C and D, kvtier on B and C.

Each service is its own process on its own namespaced host, dialled at its advertised bridge address. Faults
are a host's: every process on C killed at once, D's link cut (a partition, its processes keep running).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest

from tests.harness.graph import tiny_model_dir, wait_until
from tests.multihost.cluster import Cluster

pytestmark = pytest.mark.multihost

MODEL = "tiny"
HEARTBEAT_TIMEOUT_S = 3.0  # router drops a worker silent this long
KV_BYTES_PER_TOKEN = 36864  # the mock's simulated KV size (services/worker/engines/mock/engine.py)
NUM_BLOCKS = 512


def prompt(n: int, salt: int) -> list[int]:
    """``n`` token ids, distinct per salt from the first block on (no shared prefix between prompts)."""
    return [1 + (salt * 997 + j * 31) % 8000 for j in range(n)]


@pytest.fixture
def mock_cluster(make_hosts, tmp_path: Path) -> Iterator[Callable[[float], Cluster]]:
    """``start(speedup)``: the four-host mock graph, ready (torn down with its hosts after the test)."""
    clusters: list[Cluster] = []

    def start(speedup: float) -> Cluster:
        hs = make_hosts(4)
        a, b, c, d = hs
        cl = Cluster(hs, tmp_path, tiny_model_dir())
        clusters.append(cl)
        cl.router(a, "--policy", "round-robin", "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S))
        cl.frontend(a)
        mock = ["--engine", "mock", "--mock-speedup", str(speedup), "--num-blocks", str(NUM_BLOCKS)]
        for host in (b, c):
            cl.kvtier(host, f"kvtier-{host.index}", "--no-nixl", "--host-cache-gb", "0.25")
        cl.worker(b, "prefill", "prefill-b", *mock, "--kvtier", cl.kvtier_endpoint(b))
        cl.worker(c, "decode", "decode-c", *mock, "--kvtier", cl.kvtier_endpoint(c))
        cl.worker(d, "decode", "decode-d", *mock)
        cl.wait_ready(num_prefill=1, num_decode=2)
        return cl

    yield start
    for cl in clusters:
        cl.stop()


@dataclass
class Stream:
    """A streamed completion on a thread: its text chunks with arrival times."""

    chunks: list[tuple[float, str]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.chunks)

    def num_after(self, t: float) -> int:
        return sum(ts > t for ts, _ in self.chunks)


def stream(cl: Cluster, tokens: list[int], max_tokens: int, seed: int) -> Stream:
    s = Stream()

    def run() -> None:
        try:
            for ch in cl.client().completions.create(model=MODEL, prompt=tokens, max_tokens=max_tokens, seed=seed,
                                                     stream=True, extra_body={"ignore_eos": True}):
                if ch.choices and ch.choices[0].text:
                    s.chunks.append((time.monotonic(), ch.choices[0].text))
        except Exception as exc:  # noqa: BLE001 (the test asserts there was none)
            s.error = exc
        finally:
            s.done.set()

    threading.Thread(target=run, daemon=True).start()
    return s


def references(cl: Cluster, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """Each prompt's whole output, unstreamed and undisturbed (the mock's tokens depend on prompt and seed only)."""
    return [cl.client().completions.create(model=MODEL, prompt=p, max_tokens=max_tokens, seed=i,
                                           extra_body={"ignore_eos": True}).choices[0].text
            for i, p in enumerate(prompts)]


def busy_workers(cl: Cluster) -> dict[str, int]:
    return {w: s.load.num_running for w, s in cl.stats().items() if s.load.num_running}


def all_blocks_free(cl: Cluster, worker_ids: list[str]) -> bool:
    """Exactly these workers registered, and none holds a block (cached ones count as free: evictable)."""
    stats = cl.stats()
    return sorted(stats) == sorted(worker_ids) and all(
        s.load.num_free_blocks == s.load.num_total_blocks for s in stats.values())


def test_streams_complete_and_decode_hosts_pull_every_remote_prefill(mock_cluster) -> None:
    cl = mock_cluster(50.0)
    prompts = [prompt(n, salt) for salt, n in enumerate((300, 700, 1200, 500))]  # all above local-prefill (256)
    streams = [stream(cl, p, max_tokens=40, seed=i) for i, p in enumerate(prompts)]
    assert all(s.done.wait(60) for s in streams), "a stream hung"
    assert [s.error for s in streams] == [None] * len(streams)
    assert {w.worker_id: w.node for w in cl.workers().workers} == {
        "prefill-b": "host-b", "decode-c": "host-c", "decode-d": "host-d"}
    stats = cl.stats()
    assert stats["prefill-b"].num_transfers == 0
    decode = {w: s for w, s in stats.items() if w.startswith("decode")}
    assert all(s.num_transfers >= 1 for s in decode.values()), "round-robin: both decode hosts pulled"
    # One pull per prompt, each of the prompt's whole KV, none failed.
    pulled = sorted(t.num_bytes for s in decode.values() for t in s.recent_transfers)
    assert pulled == sorted(len(p) * KV_BYTES_PER_TOKEN for p in prompts)
    # Made up by the mock (its KV geometry, not bytes on the host link): labelled so, the router learns no link.
    assert all(t.simulated for s in decode.values() for t in s.recent_transfers)
    assert all(s.transfers_simulated for s in decode.values())
    assert sum(s.num_transfer_failures for s in decode.values()) == 0
    assert [s.text for s in streams] == references(cl, prompts, 40)


def metric(cl: Cluster, name: str) -> float:
    with urllib.request.urlopen(cl.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def start_streams(cl: Cluster, prompts: list[list[int]], max_tokens: int) -> list[Stream]:
    """Streams spread over both decode hosts, each past its first tokens."""
    streams = [stream(cl, p, max_tokens=max_tokens, seed=i) for i, p in enumerate(prompts)]
    assert wait_until(lambda: all(len(s.chunks) >= 5 for s in streams), timeout_s=30), cl.logs()
    busy = busy_workers(cl)
    assert {"decode-c", "decode-d"} <= busy.keys(), busy
    return streams


def finish(cl: Cluster, streams: list[Stream], prompts: list[list[int]], max_tokens: int, timeout_s: float) -> None:
    """Every stream ends in time, without error, with the undisturbed output."""
    deadline = time.monotonic() + timeout_s
    assert all(s.done.wait(max(0.0, deadline - time.monotonic())) for s in streams), "a stream hung"
    assert [s.error for s in streams] == [None] * len(streams), cl.logs()
    assert [s.text for s in streams] == references(cl, prompts, max_tokens)


def test_every_process_on_host_c_killed_mid_stream_its_requests_finish_on_d(mock_cluster) -> None:
    cl = mock_cluster(10.0)
    prompts = [prompt(400, 10 + i) for i in range(4)]
    streams = start_streams(cl, prompts, max_tokens=300)
    num_on_c = busy_workers(cl)["decode-c"]
    migrations_before = metric(cl, "splitserve_frontend_migrations_total")
    cl.hosts[2].kill_all()  # decode-c and kvtier-2: a machine gone
    finish(cl, streams, prompts, 300, timeout_s=60)
    assert metric(cl, "splitserve_frontend_migrations_total") - migrations_before >= num_on_c
    assert cl.health()["num_decode_workers"] == 1
    assert wait_until(lambda: all_blocks_free(cl, ["prefill-b", "decode-d"]), timeout_s=20)


def test_host_d_partitioned_mid_stream_its_requests_migrate_and_it_rejoins_clean(mock_cluster) -> None:
    cl = mock_cluster(10.0)
    d = cl.hosts[3]
    prompts = [prompt(400, 20 + i) for i in range(4)]
    streams = start_streams(cl, prompts, max_tokens=300)
    num_on_d = busy_workers(cl)["decode-d"]
    migrations_before = metric(cl, "splitserve_frontend_migrations_total")
    t_down = time.monotonic()
    d.link_down()  # D's processes keep running: a partition, not a crash
    # Migration is bounded by the heartbeat timeout plus the frontend's few watch polls (0.5 s each).
    stall_limit_s = HEARTBEAT_TIMEOUT_S + 6.0
    finish(cl, streams, prompts, 300, timeout_s=stall_limit_s + 60)
    stalls = [max(b - a for a, b in pairwise([t_down] + [ts for ts, _ in s.chunks if ts > t_down]))
              for s in streams if s.num_after(t_down)]
    print(f"partition: longest stall per stream after link down {sorted(round(x, 2) for x in stalls)} s")
    assert max(stalls) < stall_limit_s, stalls
    assert metric(cl, "splitserve_frontend_migrations_total") - migrations_before >= num_on_d
    d.link_up()
    assert wait_until(lambda: cl.health().get("num_decode_workers") == 2, timeout_s=20), cl.logs()
    pulls_before = cl.stats()["decode-d"].num_transfers
    for salt in range(4):  # round-robin: two of them land on D, remote-prefilled on B
        out = cl.client().completions.create(model=MODEL, prompt=prompt(400, 40 + salt), max_tokens=5)
        assert out.usage.completion_tokens == 5
    assert cl.stats()["decode-d"].num_transfers > pulls_before
    assert wait_until(lambda: all_blocks_free(cl, ["prefill-b", "decode-c", "decode-d"]), timeout_s=30)


NIXL_BLOCK_BYTES = 65536  # --mock-block-bytes: a 256-block region of 16 MiB per worker


def test_mock_nixl_moves_the_kv_bytes_over_the_decode_hosts_link(make_hosts, tmp_path: Path) -> None:
    """With --mock-nixl the decode host's link carries at least every KV byte the decode worker says it pulled (UCX
    picks TCP between these hosts: separate network, PID and IPC namespaces), each block checked on arrival."""
    hosts = make_hosts(3)
    a, b, c = hosts
    cl = Cluster(hosts, tmp_path, tiny_model_dir())
    try:
        cl.router(a, "--policy", "round-robin")
        cl.frontend(a)
        mock = ["--engine", "mock", "--mock-speedup", "50", "--num-blocks", "256", "--mock-nixl",
                "--mock-block-bytes", str(NIXL_BLOCK_BYTES)]
        cl.worker(b, "prefill", "prefill-b", *mock)
        cl.worker(c, "decode", "decode-c", *mock)
        cl.wait_ready(num_prefill=1, num_decode=1)
        lengths = (700, 1200, 333)
        rx_before = c.link_bytes()[0]
        for salt, n in enumerate(lengths):
            out = cl.client().completions.create(model=MODEL, prompt=prompt(n, 60 + salt), max_tokens=5)
            assert out.usage.completion_tokens == 5
        rx_bytes = c.link_bytes()[0] - rx_before
        decode = cl.stats()["decode-c"]
        pulled = [t.num_bytes for t in decode.recent_transfers]
        assert pulled == [-(-n // 32) * NIXL_BLOCK_BYTES for n in lengths], cl.logs()
        assert not any(t.simulated for t in decode.recent_transfers) and decode.num_transfer_failures == 0
        assert all(t.src_worker_id == "prefill-b" for t in decode.recent_transfers)
        print(f"mock-nixl: decode pulled {sum(pulled)} B, host C's link received {rx_bytes} B")
        assert rx_bytes >= sum(pulled)
        assert wait_until(lambda: all_blocks_free(cl, ["prefill-b", "decode-c"]), timeout_s=20)
    finally:
        cl.stop()
