"""TTFT of a long prompt onboarded from kvtier's host pool and from its disk tier vs recomputed, on a real vLLM
worker, and onboarding bandwidth vs raw NIXL READ (bench/nixl_read.py) on the same KV shape.

One aggregated vLLM worker (pinned to core 0 by `splitserve up`) with 64 usable KV blocks: a 2,040-token filler
evicts everything else from its engine. kvtier's host pool holds 126 blocks (two prompts), its disk tier the rest.
A round, on fresh token ids each time (no cross-round hits):

    P (recomputed)  F1 (recomputed, evicts P)  P (host)  F2  F3 (recomputed; P moves host -> disk)  P (disk)

so the variants interleave (A B A B, docs/architecture.md#measuring); fillers are reported apart (another ISL). Each P request's
tier hits are checked against kvtier's counters (``valid`` in the samples). Onboarding GB/s comes from the
connector's own log line per load (lookup + NIXL READ + checksum of every block; ``read_gbps``: the READ alone).

    python -m bench.tiers [--model models/tiny-100m] [--dtype bfloat16] [--prompt-tokens 2000] [--rounds 5]
        [--out bench/results/tiers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib.client import Client, StreamResult
from tests.harness.graph import Graph, ask, start_graph
from bench.lib.machine import loadavg
from bench.lib.results import MODEL_100M, conditions, require_model, write_result
from cli.launcher import GraphSpec, kvtier_block_bytes
from common.protocol import GetStats
from common.transport import new_id

GIB = 1024**3
BLOCK = 32
NUM_BLOCKS = 65  # 64 usable (vLLM keeps one null block): max_model_len 2,048
FILLER_TOKENS = 2040  # + 1 generated = 64 blocks: evicts the whole engine cache
HOST_SLOTS = 126
_KV = re.compile(r"(\w+)=(\S+)")


def up_args(args: argparse.Namespace, block_bytes: int, disk_dir: Path) -> list[str]:
    host_gb = (HOST_SLOTS + 0.5) * block_bytes / GIB  # +0.5: float rounding never loses a slot
    disk_gb = (args.rounds + 2) * 64 * block_bytes / GIB
    return ["--engine", "vllm", "--model", str(args.model), "--dtype", args.dtype, "--aggregated", "1",
            "--num-blocks", str(NUM_BLOCKS), "--host-cache-gb", repr(host_gb), "--disk-cache-gb", repr(disk_gb),
            "--disk-cache-dir", str(disk_dir)]


def kvtier_endpoint(router_port: int) -> str:
    """The endpoint of the kvtier process the graph on ``router_port`` started."""
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            continue
        if "kvtier" in args and f"tcp://127.0.0.1:{router_port}" in args:
            return args[args.index("--endpoint") + 1]
    raise LookupError("kvtier process not found")


def tier_stats(endpoint: str) -> Any:
    return asyncio.run(ask(endpoint, GetStats(request_id=new_id("b"))))


def ttft(graph: Graph, model: str, prompt: list[int]) -> tuple[float, int]:
    """(seconds to the first streamed token, cached prompt tokens reported in usage; -1: none reported)."""

    async def one() -> StreamResult:
        client = Client(graph.url)
        try:
            return await client.stream("/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}, 120.0)
        finally:
            await client.aclose()

    res = asyncio.run(one())
    if not res.ok:
        raise RuntimeError(f"request failed: {res.error}")
    return (res.ttft_s if res.ttft_s is not None else res.e2e_s), (-1 if res.cached_tokens is None
                                                                   else res.cached_tokens)


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    qs = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"n": len(values), "median": round(statistics.median(values), 3), "p10": round(qs[0], 3),
            "p90": round(qs[-1], 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def _ratio(summary: dict[str, Any], reference: float | None) -> float | None:
    return round(summary["median"] / reference, 3) if reference and summary.get("n") else None


def loads_from_log(text: str, event: str = "kvtier_loaded") -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if event in line:
            fields = dict(_KV.findall(line))
            out.append({k: (v if k in ("via", "req_id", "worker_id") else float(v)) for k, v in fields.items()})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = GraphSpec(model=args.model, engine="vllm", dtype=args.dtype, block_size=BLOCK)
    block_bytes = kvtier_block_bytes(spec)
    num_blocks_p = (args.prompt_tokens - 1) // BLOCK
    work = Path(tempfile.mkdtemp(prefix="bench-tiers-"))
    model = args.model.resolve().name
    seed = [0]

    def prompt(n: int) -> list[int]:
        seed[0] += 1
        return [(7919 * seed[0] + 104729 * i) % 7900 + 100 for i in range(n)]

    # recompute: P itself fresh (same ISL as host/disk); filler: the 2,040-token fillers, also recomputed.
    samples: dict[str, list[dict[str, Any]]] = {"recompute": [], "host": [], "disk": [], "filler": []}
    load_before = loadavg()
    raws = []
    if not args.skip_raw:  # the reference, on the same KV shape, before and after the graph (noise: both kept)
        from bench.nixl_read import run as raw_read

        raws.append(raw_read(args.model, args.dtype, args.prompt_tokens, BLOCK, repeats=30))
    graph = start_graph(work, *up_args(args, block_bytes, work / "disk"), ready_timeout_s=300.0)
    try:
        endpoint = kvtier_endpoint(graph.router_port)
        time.sleep(3)  # kvtier registers its pool with NIXL seconds after it starts
        for _ in range(2):  # warm-up: first requests pay one-off costs
            ttft(graph, model, prompt(args.prompt_tokens))

        def timed(kind: str, tokens: list[int], hits_key: str = "") -> None:
            before = tier_stats(endpoint)
            seconds, cached = ttft(graph, model, tokens)
            after = tier_stats(endpoint)
            hits = getattr(after, hits_key) - getattr(before, hits_key) if hits_key else 0
            valid = (cached == num_blocks_p * BLOCK and hits == num_blocks_p) if hits_key else cached == 0
            samples[kind].append({"ttft_ms": round(seconds * 1e3, 2), "cached_tokens": cached, "tier_hits": hits,
                                  "valid": valid})
            time.sleep(0.3)  # let the write-through land before the next request moves blocks around

        for _ in range(args.rounds):
            p = prompt(args.prompt_tokens)
            timed("recompute", p)
            timed("filler", prompt(FILLER_TOKENS))
            timed("host", p, "hits_host")
            timed("filler", prompt(FILLER_TOKENS))
            timed("filler", prompt(FILLER_TOKENS))
            timed("disk", p, "hits_disk")
        stats = tier_stats(endpoint)
    finally:
        graph.stop()
    log_text = graph.log_path.read_text(errors="replace")
    loads = loads_from_log(log_text)
    saves = loads_from_log(log_text, "kvtier_write_through")
    # Host loads come first in each round, disk loads last: split by order (every load READs all its blocks).
    nixl_loads = [x for x in loads if x.get("via") == "nixl" and x.get("num_read") == x.get("num_blocks") > 0]
    host_loads, disk_loads = nixl_loads[0::2], nixl_loads[1::2]
    if not args.skip_raw:
        raws.append(raw_read(args.model, args.dtype, args.prompt_tokens, BLOCK, repeats=30))
    ttfts = {k: _summary([s["ttft_ms"] for s in v if s["valid"]]) for k, v in samples.items()}
    load_gbps = _summary([x["gbps"] for x in host_loads])
    read_gbps = _summary([x["num_read"] * block_bytes / (x["read_ms"] / 1e3) / 1e9 for x in host_loads
                          if x.get("read_ms")])
    raw_gbps = round(statistics.mean(r["scattered"]["gbps_median"] for r in raws), 3) if raws else None
    doc = {
        "ttft_ms": ttfts,
        "ttft_ratio_vs_recompute": {k: round(ttfts[k]["median"] / ttfts["recompute"]["median"], 3)
                                    for k in ("host", "disk") if ttfts[k]["n"] and ttfts["recompute"]["n"]},
        "onboarding_host": {"load_gbps": load_gbps, "read_gbps": read_gbps, "raw_nixl_read_gbps": raw_gbps,
                            "raw_nixl_read_gbps_each": [r["scattered"]["gbps_median"] for r in raws],
                            "load_vs_raw": _ratio(load_gbps, raw_gbps), "read_vs_raw": _ratio(read_gbps, raw_gbps),
                            "loads": host_loads},
        "onboarding_disk": {"load_gbps": _summary([x["gbps"] for x in disk_loads]), "loads": disk_loads},
        # The engine step's share of a write-through: packing the prompt's blocks (the send is asynchronous).
        "write_through_ms": {"prompt": _summary([x["ms"] for x in saves if x["num_blocks"] == num_blocks_p]),
                             "filler": _summary([x["ms"] for x in saves if x["num_blocks"] != num_blocks_p])},
        "samples": samples,
        "tier_stats": {k: getattr(stats, k) for k in ("host_slots", "disk_slots", "hits_host", "hits_disk",
                                                       "demotions", "checksum_failures", "disk_io", "nixl")},
        # bench/nixl_read.py before and after the graph: READ of the same blocks between two bare processes.
        "raw_nixl_read": raws,
        "conditions": conditions(
            "tiers", model=str(args.model), dtype=args.dtype, isl=args.prompt_tokens, osl=1,
            filler_tokens=FILLER_TOKENS, block_size=BLOCK, block_bytes=block_bytes, blocks_onboarded=num_blocks_p,
            engine_num_blocks=NUM_BLOCKS, host_slots=HOST_SLOTS, rounds=args.rounds,
            workers="1 aggregated vLLM worker (core 0), kvtier, router, frontend",
            tiers={"host": "kvtier host pool (NIXL-registered DRAM)",
                   "disk": "kvtier disk slab (page cache), read into bounce slots of the pool on lookup"},
            transfer_backend={"host": "NIXL UCX READ into the worker's KV cache + xxh3 check per block",
                              "disk": "kvtier: NIXL POSIX file -> bounce slot + xxh3; worker: NIXL UCX READ + xxh3",
                              "save": "inline bytes over ZeroMQ"},
            ttft="HTTP /v1/completions stream (bench/lib/client.py), max_tokens=1, to the first token",
            loadavg_before=load_before, loadavg_after=loadavg()),
    }
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-raw", action="store_true", help="no raw NIXL READ reference")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    require_model(args.model)
    if args.prompt_tokens > (NUM_BLOCKS - 1) * BLOCK - 1:
        raise SystemExit(f"--prompt-tokens must be < {(NUM_BLOCKS - 1) * BLOCK}")
    doc = run(args)
    print(json.dumps({k: doc[k] for k in ("ttft_ms", "ttft_ratio_vs_recompute")}, indent=2))
    print(json.dumps({k: v for k, v in doc["onboarding_host"].items() if k != "loads"}, indent=2))
    if args.out:
        write_result(args.out, doc)


if __name__ == "__main__":
    main()
