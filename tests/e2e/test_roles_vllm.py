"""The real path of a role switch: three vLLM engines with kv_both (2 prefill, 1 decode); one prefill worker is
moved to decode while requests run. No request fails, the moved worker then decodes with KV the other prefill
worker moved to it over NIXL (pull: it READs it; push: the prefill engine WRITEs it into its blocks, vLLM's
NixlPushConnector with kv_both), and every output equals one vLLM engine's doing both (fp32, greedy). Measures the
switch: the router's decision to the worker serving (RoleSet.seconds), and to its first KV transfer as a decode
worker."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time

import pytest

from tests.harness.graph import REPO, Graph, start_graph, wait_until, worker_stats
from tests.e2e.reference import VLLM_ARGS, Reference, complete, prompt

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                    reason="vllm not installed")]
MOVED = "prefill-1"
LENGTHS = (300, 450, 700, 1000)  # above the local-prefill threshold (64 here): remote prefills
NUM_CLIENTS = 3


def _set_role(graph: Graph, worker_id: str, role: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "router", "set-role", worker_id, role,
                           "--router", graph.router, "--reason", "test"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _into(stats: dict, src: str, dst: str) -> list:
    """The transfers ``src``'s KV made into ``dst`` that the initiator reported (pull: dst's READs; push: src's
    WRITEs)."""
    return ([t for t in stats[dst].recent_transfers if t.src_worker_id == src and not t.dst_worker_id]
            + [t for t in stats[src].recent_transfers if t.dst_worker_id == dst])


def _key(index: int, i: int) -> tuple[int, int]:
    """Client ``index``'s ``i``-th prompt (length, salt): distinct prompts, no shared prefix; the same in both
    arms, so the reference computes each once."""
    return LENGTHS[(i + index) % len(LENGTHS)], 1000 * index + i


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_prefill_worker_moved_to_decode_serves_transferred_kv(tmp_path, mode: str,
                                                              vllm_reference: Reference) -> None:
    graph = start_graph(tmp_path, *VLLM_ARGS, "--prefill", "2", "--decode", "1", "--switchable",
                        "--no-kvtier", "--kv-transfer", mode, log_name=f"roles-vllm-{mode}.log")
    outputs: dict[tuple[int, int], tuple[str, int]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    phase = {"salt": 0}
    stop = threading.Event()

    def run_client(index: int) -> None:
        i = 0
        while not stop.is_set():
            n, salt = _key(index, i)
            i += 1
            try:
                out = complete(graph, prompt(n, salt=salt))
            except Exception as exc:  # noqa: BLE001 - counted
                with lock:
                    errors.append(repr(exc))
                continue
            with lock:
                outputs[(n, salt)] = out

    try:
        threads = [threading.Thread(target=run_client, args=(k,), daemon=True) for k in range(NUM_CLIENTS)]
        for t in threads:
            t.start()
        assert wait_until(lambda: len(outputs) >= 6, timeout_s=240), (errors, graph.logs()[-3000:])
        before = worker_stats(graph.router)
        assert not _into(before, "prefill-0", MOVED)  # a prefill worker so far
        decided = time.monotonic()
        answer = _set_role(graph, MOVED, "decode")  # a CLI process: its start-up counts in first_pull_s
        answered = time.monotonic()
        assert answer["ok"] and answer["role"] == "decode", answer
        num_at_switch = len(outputs)
        # From the decision to the moved worker's first KV as a decode worker (a request must reach it first).
        assert wait_until(lambda: _into(worker_stats(graph.router), "prefill-0", MOVED), timeout_s=120,
                          interval_s=0.02), (len(outputs) - num_at_switch, errors[:3],
                                             {w: (s.num_transfers, s.num_transfer_failures, s.recent_transfers[-3:])
                                              for w, s in worker_stats(graph.router).items()},
                                             graph.logs()[-6000:])
        first_pull_s, answer_to_pull_s = time.monotonic() - decided, time.monotonic() - answered
        assert wait_until(lambda: len(outputs) >= num_at_switch + 9, timeout_s=240)
        stop.set()
        for t in threads:
            t.join(timeout=240)
        # A READ shows its source once a heartbeat has carried it (services/worker/transfer_sources.py): the last
        # ones may not have gone out yet.
        wait_until(lambda: all(t.src_worker_id for t in worker_stats(graph.router)[MOVED].recent_transfers),
                   timeout_s=5)
        after = worker_stats(graph.router)
    finally:
        stop.set()
        graph.stop()
    print(f"role switch ({mode}): RoleSet.seconds={answer['seconds']:.4f} set-role CLI start->first KV as decode="
          f"{first_pull_s:.3f}s answer->first pull={answer_to_pull_s:.3f}s requests={len(outputs)} "
          f"at switch={num_at_switch}")
    assert not errors, errors[:3]
    moved = after[MOVED]
    assert moved.num_transfer_failures == 0 and after["prefill-0"].num_transfer_failures == 0
    assert _into(after, "prefill-0", MOVED)
    if mode == "pull":  # every READ it made, it made as a decode worker, from the other prefill worker
        assert moved.num_transfers > 0 and {t.src_worker_id for t in moved.recent_transfers} == {"prefill-0"}
    else:  # as a prefill worker it WROTE into the decode worker only; as a decode worker it initiates nothing
        assert {(t.src_worker_id, t.dst_worker_id) for t in moved.recent_transfers} == {(MOVED, "decode-2")}
        assert {t.dst_worker_id for t in after["prefill-0"].recent_transfers} == {"decode-2", MOVED}
    assert all(num == 16 for _, num in outputs.values())
    # Every output (before, across and after the switch) equals one engine doing both. While that engine is up
    # it also computes a few more of each client's prompts than this arm sent: the other arm's clients send the
    # same ones, and then need no engine of their own (one they do need is started for them).
    keys = sorted(outputs)
    num_each = max(salt % 1000 for _, salt in keys) + 5
    extra = [prompt(*_key(k, i)) for k in range(NUM_CLIENTS) for i in range(num_each)]
    ref = vllm_reference.outputs([prompt(n, salt=salt) for n, salt in keys], extra=extra)
    for (n, salt), want in zip(keys, ref, strict=True):
        assert outputs[(n, salt)] == want, f"prompt of {n} tokens, salt {salt}"
    assert answer["seconds"] < 1.0
