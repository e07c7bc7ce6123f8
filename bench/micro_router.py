"""Router microbenchmark: one route decision against a large prefix index, and KV event ingest.

Decision = hash a 4,000-token prompt + look up overlaps on 64 workers + choose (what the route RPC does,
without the socket). Index: 64 workers, ~1M (worker, tier, hash) entries from documents that all start with a
shared system prompt (so every worker matches the first blocks and the walk tracks all 64 for a while).
Measured twice: device blocks only, then with a shared kvtier holding host copies of a third of the documents.
Writes bench/results/micro_router.json and prints it.

    python -m bench.micro_router [--trials 2000] [--blocks 1000000]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from pathlib import Path

from bench.lib.results import RESULTS, conditions, write_result
from common.hashing import block_hashes, hash_seed
from common.protocol import BlockRemoved, BlockStored, KvEvents, WorkerLoad, decode, encode
from services.router.index import PrefixIndex
from services.router.policy import Candidate, Policy, PolicyConfig

BLOCK_SIZE = 16
NUM_WORKERS = 64
PROMPT_TOKENS = 4000
SYSTEM_TOKENS = 512  # shared by every document: 32 blocks every worker holds
REPLICAS = 2  # workers per document
EVENT_BATCH_BLOCKS = 16  # blocks per BlockStored in the ingest test (one request's worth of new blocks)
VOCAB = 50_000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def build_index(rng: random.Random, seed: int, target_blocks: int) -> tuple[PrefixIndex, list[list[int]]]:
    system = [rng.randrange(VOCAB) for _ in range(SYSTEM_TOKENS)]
    index = PrefixIndex()
    docs: list[list[int]] = []
    while index.num_blocks < target_blocks:
        doc = system + [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS - SYSTEM_TOKENS)]
        docs.append(doc)
        hashes = block_hashes(doc, BLOCK_SIZE, seed)
        for worker in rng.sample(range(NUM_WORKERS), REPLICAS):
            index.apply(f"w{worker:02d}", BlockStored(block_hashes=tuple(hashes), parent_hash=None, tier="device"))
    return index, docs


def bench_decisions(index: PrefixIndex, docs: list[list[int]], seed: int, trials: int, rng: random.Random) -> dict:
    policy = Policy(PolicyConfig(), seed=0)
    candidates = [
        Candidate(f"w{i:02d}", WorkerLoad(num_running=rng.randrange(8), num_free_blocks=rng.randrange(2000, 8000),
                                         num_total_blocks=8192, num_active_blocks=rng.randrange(300)))
        for i in range(NUM_WORKERS)
    ]
    # Each prompt: the first 3,200 tokens of a stored document, then 800 new tokens.
    prompts = [docs[rng.randrange(len(docs))][:3200] + [rng.randrange(VOCAB) for _ in range(800)]
               for _ in range(trials)]
    total, cpu, t_hash, t_overlap, t_choose, hits = [], [], [], [], [], []
    for prompt in prompts:
        c0 = time.thread_time()
        t0 = time.perf_counter()
        hashes = block_hashes(prompt, BLOCK_SIZE, seed)
        t1 = time.perf_counter()
        overlaps = index.overlaps(hashes)
        t2 = time.perf_counter()
        choice = policy.choose_route(hashes, len(prompt), BLOCK_SIZE, candidates, [], overlaps)
        t3 = time.perf_counter()
        cpu.append(time.thread_time() - c0)
        total.append(t3 - t0)
        t_hash.append(t1 - t0)
        t_overlap.append(t2 - t1)
        t_choose.append(t3 - t2)
        hits.append(choice.num_cached_tokens_predicted)
    us = 1e6
    return {
        "trials": trials,
        # Wall clock: what a request sees, including other processes taking the core.
        "p50_us": round(_pct(total, 0.50) * us, 1),
        "p99_us": round(_pct(total, 0.99) * us, 1),
        "max_us": round(max(total) * us, 1),
        # CPU time of this thread: the decision's own cost, robust to a shared machine.
        "cpu_p50_us": round(_pct(cpu, 0.50) * us, 1),
        "cpu_p99_us": round(_pct(cpu, 0.99) * us, 1),
        "hash_p50_us": round(statistics.median(t_hash) * us, 1),
        "overlaps_p50_us": round(statistics.median(t_overlap) * us, 1),
        "choose_p50_us": round(statistics.median(t_choose) * us, 1),
        "mean_predicted_cached_tokens": round(statistics.mean(hits), 1),
    }


def bench_ingest(target_blocks: int, seed: int, rng: random.Random) -> dict:
    """Fill a fresh index from numbered KvEvents batches (decoded from msgpack), then remove them all."""
    num_batches = target_blocks // EVENT_BATCH_BLOCKS
    batches = []
    next_id = [0] * NUM_WORKERS
    for _ in range(num_batches):
        worker = rng.randrange(NUM_WORKERS)
        hashes = tuple(rng.getrandbits(64) for _ in range(EVENT_BATCH_BLOCKS))
        event = BlockStored(block_hashes=hashes, parent_hash=None, tier="device")
        batches.append(encode(KvEvents(worker_id=f"w{worker:02d}", event_id=next_id[worker], events=(event,))))
        next_id[worker] += 1
    index = PrefixIndex()
    # Streamed like the router does: decode one message, apply it, drop it.
    w0, c0 = time.perf_counter(), time.process_time()
    for raw in batches:
        index.apply_events(decode(raw))
    store_wall, store_cpu = time.perf_counter() - w0, time.process_time() - c0
    stored = index.num_blocks
    removals = [(m.worker_id, BlockRemoved(block_hashes=m.events[0].block_hashes, tier="device"))
                for m in map(decode, batches)]
    w0, c0 = time.perf_counter(), time.process_time()
    for worker_id, event in removals:
        index.apply(worker_id, event)
    remove_wall, remove_cpu = time.perf_counter() - w0, time.process_time() - c0
    assert index.num_blocks == 0
    return {
        "blocks": stored,
        "blocks_per_event": EVENT_BATCH_BLOCKS,
        "store_blocks_per_s": round(stored / store_wall),  # msgpack decode + event check + index, wall
        "store_blocks_per_cpu_s": round(stored / store_cpu),
        "remove_blocks_per_s": round(stored / remove_wall),
        "remove_blocks_per_cpu_s": round(stored / remove_cpu),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "micro_router.json")
    args = parser.parse_args()
    rng = random.Random(0)
    seed = hash_seed("bench-model")

    t0 = time.perf_counter()
    index, docs = build_index(rng, seed, args.blocks)
    build_s = time.perf_counter() - t0
    decisions = bench_decisions(index, docs, seed, args.trials, rng)
    # Same again with a shared kvtier holding host copies of a third of the documents (all tiers walked).
    index.mark_shared("kvtier")
    for doc in docs[::3]:
        hashes = tuple(block_hashes(doc, BLOCK_SIZE, seed))
        index.apply("kvtier", BlockStored(block_hashes=hashes, parent_hash=None, tier="host"))
    decisions_kvtier = bench_decisions(index, docs, seed, args.trials, rng)
    indexed_blocks = index.num_blocks
    del index, docs
    ingest = bench_ingest(args.blocks, seed, rng)
    result = {
        "benchmark": "micro_router",
        "conditions": conditions(
            "micro_router", block_size=BLOCK_SIZE, workers=NUM_WORKERS, prompt_tokens=PROMPT_TOKENS,
            prompt="first 3,200 tokens of a stored document + 800 new", shared_system_prompt_tokens=SYSTEM_TOKENS,
            replicas_per_document=REPLICAS, policy="kv, aggregated (64 decode candidates, no prefill pool)",
            target_indexed_blocks=args.blocks, index_build_s=round(build_s, 2),
            indexed_blocks_with_kvtier=indexed_blocks,
            max_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)),
        "decision": decisions,
        "decision_with_kvtier_host": decisions_kvtier,
        "ingest": ingest,
        "goals": {"p99_us_below": 1000, "ingest_blocks_per_s_at_least": 100_000},
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
