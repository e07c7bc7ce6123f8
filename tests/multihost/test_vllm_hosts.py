"""Real vLLM across hosts: frontend + router on A, vLLM prefill and a kvtier on B, vLLM decode and a kvtier on C;
the decode engine pulls the prompt's KV from B with NIXL over the bridge (separate PID and IPC namespaces: UCX
cannot use shared memory or CMA, it takes TCP). fp32 and greedy: outputs must equal one aggregated engine's token
for token. Then both workers are killed -9 and started again against the warm tiers: the prompts come back from
the tiers (vLLM's MultiConnector, NIXL beside the kvtier connector, whose first load used to kill the engine) with
the same outputs, and the engines keep serving."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.graph import tiny_model_dir, wait_until
from tests.harness.hosts import Host
from common.protocol import WorkerStats
from tests.multihost.cluster import Cluster, node_name

pytestmark = [pytest.mark.multihost, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]
MODEL = "tiny"
LENGTHS = (100, 600, 1500)
MAX_TOKENS = 16
VLLM = ("--engine", "vllm", "--dtype", "float32", "--block-size", "32", "--kv-cache-gib", "1")
READY_TIMEOUT_S = 300.0  # two engines starting at once on a busy 2-core machine


def prompt(length: int) -> list[int]:
    # A different salt per length: prompts must not share prefixes, or the cached part makes prefill local.
    return [(97 * i + 13 * length) % 8000 + 100 for i in range(length)]


def nixl_args(host: Host) -> tuple[str, ...]:
    """vLLM's NIXL side channel bound to, and advertised at, the host's bridge address (not loopback)."""
    # Pull: the decode worker's READs are what this test reads (push: the prefill worker's WRITEs).
    return ("--nixl-host", host.address, "--nixl-advertise", host.address, "--kv-transfer", "pull")


def kv_bytes_per_block(model_dir: Path, block_size: int = 32, dtype_bytes: int = 4) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    # K and V, per layer, per KV head: (block_size, head_dim) values.
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes * block_size


@dataclass
class Run:
    pd: dict[int, tuple[str, int]]  # prompt length -> (text, completion tokens), prefill on B, decode on C
    agg: dict[int, tuple[str, int]]  # the same prompts on one engine doing both
    decode: WorkerStats
    prefill: WorkerStats
    decode_rx_bytes: int  # received on host C's link while the P/D requests ran
    nodes: dict[str, str]  # worker id -> node it registered
    after_restart: dict[int, tuple[str, int]]  # the same prompts, both workers restarted, the tiers warm
    tier_hits: int  # host-pool hits of B's and C's tiers while the restarted workers served them
    logs: str  # every service's log


def complete(cl: Cluster, tokens: list[int]) -> tuple[str, int]:
    out = cl.client(timeout_s=300).completions.create(model=MODEL, prompt=tokens, max_tokens=MAX_TOKENS,
                                                      temperature=0, extra_body={"ignore_eos": True})
    return out.choices[0].text, out.usage.completion_tokens


def _registered_anew(cl: Cluster, worker_ids: set[str], killed: set[str]) -> bool:
    if dead := [s.name for s in cl.services if s.proc.poll() is not None]:
        raise RuntimeError(f"exited: {dead}\n{cl.logs()}")
    listed = cl.workers().workers
    return {w.worker_id for w in listed} == worker_ids and not {w.instance_id for w in listed} & killed


@pytest.fixture(scope="module")
def vllm_run(make_module_hosts, tmp_path_factory, vllm_reference) -> Run:
    """One P/D graph over three hosts asked every prompt; then one aggregated engine's outputs of the same."""
    hs = make_module_hosts(3)
    a, b, c = hs
    cl = Cluster(hs, tmp_path_factory.mktemp("vllm-hosts"), tiny_model_dir())
    try:
        cl.router(a, "--policy", "round-robin", "--local-prefill-max-tokens", "64")
        cl.frontend(a)
        block_bytes = str(kv_bytes_per_block(tiny_model_dir()))
        workers = {"prefill-b": (b, "prefill", "0"), "decode-c": (c, "decode", "1")}
        for worker_id, (host, role, core) in workers.items():
            cl.kvtier(host, f"kvtier-{node_name(host)}", "--host-cache-gb", "0.05", "--block-bytes", block_bytes)
            cl.worker(host, role, worker_id, *VLLM, *nixl_args(host), "--kvtier", cl.kvtier_endpoint(host),
                      "--core", core)
        cl.wait_ready(num_prefill=1, num_decode=1, timeout_s=READY_TIMEOUT_S)
        rx_before = c.link_bytes()[0]
        pd = {n: complete(cl, prompt(n)) for n in LENGTHS}
        rx_bytes = c.link_bytes()[0] - rx_before
        stats = cl.stats()
        nodes = {w.worker_id: w.node for w in cl.workers().workers}
        # Both workers crash and come back (as their supervisor would start them) while the tiers stay warm.
        killed = {w.instance_id for w in cl.workers().workers}
        for worker_id in workers:
            cl.kill_service(worker_id)
        for worker_id, (host, role, core) in workers.items():
            cl.worker(host, role, worker_id, *VLLM, *nixl_args(host), "--kvtier", cl.kvtier_endpoint(host),
                      "--core", core)
        # The router lists the killed processes until their heartbeats time out: wait for the new ones.
        assert wait_until(lambda: _registered_anew(cl, set(workers), killed), timeout_s=READY_TIMEOUT_S,
                          interval_s=1.0), cl.logs()
        hits_before = sum(cl.tier_stats(h).hits_host for h in (b, c))
        after_restart = {n: complete(cl, prompt(n)) for n in reversed(LENGTHS)}
        tier_hits = sum(cl.tier_stats(h).hits_host for h in (b, c)) - hits_before
        assert all(s.proc.poll() is None for s in cl.services), cl.logs()  # no engine died serving the hits
        logs = cl.logs(tail_chars=200_000)
    finally:
        cl.stop(timeout_s=30)
    # One engine doing both (same model, dtype, block size), once these are stopped: two more engines would not
    # fit beside them on 2 cores. The session's reference (tests/e2e/reference.py) computed these prompts when
    # tests/e2e/test_vllm_disagg.py ran first, else it starts that engine now (on loopback: where it runs does not
    # change its outputs).
    agg = dict(zip(LENGTHS, vllm_reference.outputs([prompt(n) for n in LENGTHS]), strict=True))
    return Run(pd, agg, stats["decode-c"], stats["prefill-b"], rx_bytes, nodes, after_restart, tier_hits, logs)


def test_pd_across_hosts_equals_one_engine(vllm_run: Run) -> None:
    assert {n: num for n, (_, num) in vllm_run.pd.items()} == dict.fromkeys(LENGTHS, MAX_TOKENS)
    for n in LENGTHS:
        assert vllm_run.pd[n] == vllm_run.agg[n], f"prompt of {n} tokens"
    assert vllm_run.nodes == {"prefill-b": "host-b", "decode-c": "host-c"}


def test_decode_host_pulled_every_prompts_kv_from_b_over_the_link(vllm_run: Run) -> None:
    decode = vllm_run.decode
    assert decode.num_transfers == len(LENGTHS) and decode.num_transfer_failures == 0
    assert vllm_run.prefill.num_transfers == 0
    # One READ per prompt, in order, of all the prompt's blocks (the last one partly filled).
    block_bytes = kv_bytes_per_block(tiny_model_dir())
    pulls = decode.recent_transfers
    assert [p.seq for p in pulls] == [1, 2, 3]
    print(f"pulls: {[(p.num_bytes, round(p.seconds, 4)) for p in pulls]}; rx on C: {vllm_run.decode_rx_bytes}")
    for n, pull in zip(LENGTHS, pulls, strict=True):
        assert pull.num_bytes == math.ceil(n / 32) * block_bytes, n
        assert pull.seconds > 0 and pull.num_descriptors > 0
    # The bytes crossed host C's link: the pulls did not go through shared memory.
    assert vllm_run.decode_rx_bytes >= decode.num_transfer_bytes


def test_restarted_workers_serve_the_warm_tiers_hits_and_live(vllm_run: Run) -> None:
    # Every full block of every prompt was written through to a tier; the fresh engines loaded them back.
    assert vllm_run.tier_hits >= sum(n // 32 for n in LENGTHS), vllm_run.tier_hits
    for n in LENGTHS:
        assert vllm_run.after_restart[n] == vllm_run.agg[n], f"prompt of {n} tokens after the restart"
    assert "registered connectors with Prometheus" not in vllm_run.logs
    assert "EngineDeadError" not in vllm_run.logs
