"""Raw NIXL READ between two processes, shaped like the KV cache of one long prompt: the ceiling for P/D pulls.

A target process (the "prefill" side) registers a DRAM buffer laid out like vLLM 0.32's CPU KV cache (layout
LBHNC: per layer one region of ``num_blocks`` blocks, K and V of a block adjacent, so one block of one layer is
``2 * block_size * kv_heads * head_dim * dtype`` bytes; vLLM's NIXL log says ``remote_block_len=32768`` for the
100M model in bf16). ``--split-kv`` lays K and V out as separate regions instead (half-size descriptors).
An initiator process (the "decode" side) registers a buffer of the same shape and READs the prompt's blocks,
scattered block ids on both sides (as a busy cache hands them out): ``layers * prompt_blocks`` descriptors
of one block each, the same bytes vLLM's NixlConnector moves for that prompt. Also a coalesced variant (the same
bytes as one descriptor per region: block ids adjacent), the best layout can do.

NIXL per docs/architecture.md#nixl-facts: agents made after spawn, ``nixl_agent_config(enable_prog_thread=False, backends=[])``,
UCX with ``ucx_error_handling_mode=none``, the target drains ``get_new_notifs``, descriptor lists prepared once.

    python -m bench.nixl_read [--model models/tiny-100m] [--dtype bfloat16] [--prompt-tokens 2000]
        [--repeats 30] [--out bench/results/nixl_read.json]

Prints and returns {"scattered": {...GB/s...}, "coalesced": {...}, "conditions": {...}}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import time
from pathlib import Path

from bench.lib.machine import loadavg, machine
from bench.lib.report import now_iso
from bench.lib.results import MODEL_100M, write_result

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_shape(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    return {"layers": cfg["num_hidden_layers"], "kv_heads": cfg.get("num_key_value_heads", heads),
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads}


def _agent(name: str):
    from nixl._api import nixl_agent, nixl_agent_config

    # Telemetry: NIXL's own per-transfer duration, the figure vLLM's connector reports for each pull.
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=[], capture_telemetry=True))
    agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    return agent


def _layout(num_regions: int, num_blocks: int, block_bytes: int):
    import numpy as np

    buf = np.zeros(num_regions * num_blocks * block_bytes, dtype=np.uint8)
    buf[:: 4096] = 1  # touch every page so the READ does not measure page faults
    return buf


def _descs(base: int, regions: int, num_blocks: int, block_bytes: int, block_ids: list[int]) -> list:
    return [(base + (r * num_blocks + b) * block_bytes, block_bytes, 0) for r in range(regions) for b in block_ids]


def _coalesced(base: int, regions: int, num_blocks: int, block_bytes: int, start: int, count: int) -> list:
    return [(base + (r * num_blocks + start) * block_bytes, count * block_bytes, 0) for r in range(regions)]


def _pin(core: int | None) -> None:
    if core is not None and core in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {core})


def target(conn, regions: int, num_blocks: int, block_bytes: int, src_ids: list[int], core: int | None = None,
           poll_s: float = 0.001) -> None:
    """``poll_s``: the longest wait between two progress calls. Within a host UCX copies with CMA and the target
    need not progress at all; over TCP UCX emulates the READ with active messages the target answers when it
    progresses, so a cross-host ceiling wants 0 (spin)."""
    _pin(core)
    agent = _agent("target")
    buf = _layout(regions, num_blocks, block_bytes)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    base = buf.ctypes.data
    conn.send({"meta": agent.get_agent_metadata(),
               "scattered": _descs(base, regions, num_blocks, block_bytes, src_ids),
               "coalesced": _coalesced(base, regions, num_blocks, block_bytes, 0, len(src_ids))})
    while True:  # drain notifications until told to stop (undrained ones hang the initiator)
        agent.get_new_notifs()
        if conn.poll(poll_s):
            if conn.recv() == "stop":
                break
    agent.deregister_memory(reg)
    conn.send("stopped")


def initiator(conn, regions: int, num_blocks: int, block_bytes: int, dst_ids: list[int], repeats: int,
              core: int | None = None, interval_s: float = 0.0) -> None:
    _pin(core)
    agent = _agent("initiator")
    buf = _layout(regions, num_blocks, block_bytes)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    base = buf.ctypes.data
    info = conn.recv()
    peer = agent.add_remote_agent(info["meta"])
    results = {}
    variants = {"scattered": _descs(base, regions, num_blocks, block_bytes, dst_ids),
                "coalesced": _coalesced(base, regions, num_blocks, block_bytes, 0, len(dst_ids))}
    for name, local in variants.items():
        remote = info[name]
        assert sum(d[1] for d in local) == sum(d[1] for d in remote)
        local_h = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM")
        remote_h = agent.prep_xfer_dlist(peer, remote, "DRAM")
        idx = list(range(len(local)))
        times, nixl_times = [], []
        for i in range(repeats + 1):
            time.sleep(interval_s)  # spaced out: sampling a busy machine, not hammering it
            t0 = time.perf_counter()
            handle = agent.make_prepped_xfer("READ", local_h, idx, remote_h, idx, f"r{i}".encode())
            state = agent.transfer(handle)
            while state not in ("DONE", "ERR"):
                state = agent.check_xfer_state(handle)
            t1 = time.perf_counter()
            nixl_times.append(agent.get_xfer_telemetry(handle).xferDuration / 1e6 if state == "DONE" else 0.0)
            agent.release_xfer_handle(handle)
            if state == "ERR":
                raise RuntimeError(f"NIXL READ failed ({name})")
            times.append(t1 - t0)
        nbytes = sum(d[1] for d in local)
        warm = times[1:]
        results[name] = {
            "bytes": nbytes, "num_descriptors": len(local), "repeats": repeats,
            "first_s": round(times[0], 6), "median_s": round(statistics.median(warm), 6),
            "min_s": round(min(warm), 6),
            "gbps_first": round(nbytes / times[0] / 1e9, 3),
            "gbps_median": round(nbytes / statistics.median(warm) / 1e9, 3),
            "gbps_best": round(nbytes / min(warm) / 1e9, 3),
            # NIXL telemetry (xferDuration: post to the status check that saw DONE), like a pull's sample.
            "telemetry_median_s": round(statistics.median(nixl_times[1:]), 6),
            "gbps_median_telemetry": round(nbytes / max(statistics.median(nixl_times[1:]), 1e-9) / 1e9, 3),
        }
        agent.release_dlist_handle(local_h)
        agent.release_dlist_handle(remote_h)
    agent.remove_remote_agent(peer)
    agent.deregister_memory(reg)
    conn.send(results)


def plan(shape: dict, dtype: str, prompt_tokens: int, block_size: int = 32, cache_blocks: int = 1024, seed: int = 0,
         split_kv: bool = False) -> dict:
    """The two buffers' layout and the prompt's block ids on each side (what target and initiator are given)."""
    kv_bytes = block_size * shape["kv_heads"] * shape["head_dim"] * DTYPE_BYTES[dtype]  # K (or V) of one block
    # vLLM CPU (LBHNC): one region per layer, K+V of a block adjacent; split_kv: K and V regions apart.
    regions, block_bytes = (shape["layers"] * 2, kv_bytes) if split_kv else (shape["layers"], 2 * kv_bytes)
    prompt_blocks = -(-prompt_tokens // block_size)  # vLLM pulls every prompt block, the partial last one too
    rng = random.Random(seed)
    return {"regions": regions, "block_bytes": block_bytes, "prompt_blocks": prompt_blocks,
            "cache_blocks": cache_blocks, "src_ids": rng.sample(range(cache_blocks), prompt_blocks),
            "dst_ids": rng.sample(range(cache_blocks), prompt_blocks)}


def run(model: Path, dtype: str, prompt_tokens: int, block_size: int = 32, cache_blocks: int = 1024,
        repeats: int = 30, seed: int = 0, split_kv: bool = False, cores: tuple[int, int] | None = None,
        interval_s: float = 0.0) -> dict:
    """``cores``: (target core, initiator core) to pin the two processes to, e.g. a P/D graph's prefill and
    decode cores while that graph is under load; None: unpinned."""
    shape = kv_shape(model)
    p = plan(shape, dtype, prompt_tokens, block_size, cache_blocks, seed, split_kv)
    regions, block_bytes, prompt_blocks = p["regions"], p["block_bytes"], p["prompt_blocks"]
    src_ids, dst_ids = p["src_ids"], p["dst_ids"]
    ctx = mp.get_context("spawn")
    t_conn, t_child = ctx.Pipe()
    i_conn, i_child = ctx.Pipe()
    load_before = loadavg()
    t_core, i_core = cores if cores is not None else (None, None)
    tp = ctx.Process(target=target, args=(t_child, regions, cache_blocks, block_bytes, src_ids, t_core))
    ip = ctx.Process(target=initiator, args=(i_child, regions, cache_blocks, block_bytes, dst_ids, repeats, i_core,
                                             interval_s))
    tp.start()
    ip.start()
    try:
        i_conn.send(t_conn.recv())
        if not i_conn.poll(300):
            raise RuntimeError("initiator did not finish in 300 s")
        results = i_conn.recv()
        t_conn.send("stop")
        t_conn.recv()
    finally:
        for p in (ip, tp):
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return {**results, "conditions": {
        "model": str(model), "dtype": dtype, "kv_shape": shape, "prompt_tokens": prompt_tokens,
        "block_size": block_size, "block_bytes": block_bytes, "prompt_blocks": prompt_blocks,
        "regions": regions, "split_kv": split_kv, "cache_blocks": cache_blocks, "memory": "DRAM", "backend": "NIXL UCX",
        "nixl_agent_config": "enable_prog_thread=False, backends=[]; UCX ucx_error_handling_mode=none",
        "processes": "2 (spawn), " + (f"target on core {t_core}, initiator on core {i_core}" if cores is not None
                                      else "no CPU pinning"),
        "interval_s": interval_s, "timing": "make_prepped_xfer + transfer + poll to DONE",
        "loadavg_before": load_before, "loadavg_after": loadavg(), "timestamp": now_iso(),
    }}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--split-kv", action="store_true", help="K and V in separate regions (half-size descriptors)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    doc = run(args.model, args.dtype, args.prompt_tokens, args.block_size, repeats=args.repeats,
              split_kv=args.split_kv)
    doc["conditions"]["machine"] = machine()
    print(json.dumps(doc, indent=2))
    if args.out:
        write_result(args.out, doc)


if __name__ == "__main__":
    main()
