"""NIXL READ of KV-shaped memory between two processes on one device: bytes checked, GB/s beside a plain
device-to-device copy of the same bytes in one process.

Each process holds a KV cache shaped ``[layers, num_blocks, block_bytes]`` (one region per layer, as vLLM's
NixlConnector registers it) on ``--device`` (cuda: VRAM; cpu: DRAM, the same code, to check it here). The target
fills its cache with seeded random bytes; the initiator READs ``--read-blocks`` scattered blocks of every layer
(one descriptor per layer-block, as a P/D pull) into other scattered block ids and compares a sha256 of what it
got with the target's. UCX settings are the worker's (services/worker/engines/vllm/ucx.py).

    python3 scripts/device_check/nixl_vram.py --device cuda --out nixl_vram.json
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import random
import statistics
import time

import dc_common  # noqa: F401 (the repository on sys.path)
from dc_common import gbps, nixl_api, write_json


def _agent(name: str):
    api = nixl_api()
    agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=[]))
    agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    return agent


def _cache(device: str, layers: int, num_blocks: int, block_bytes: int, seed: int | None):
    import torch

    if device == "cuda":
        torch.cuda.set_device(0)
    if seed is None:
        return torch.zeros((layers, num_blocks, block_bytes), dtype=torch.uint8, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (layers, num_blocks, block_bytes), dtype=torch.uint8, device=device, generator=gen)


def _mem(device: str) -> tuple[str, int]:
    return ("VRAM", 0) if device == "cuda" else ("DRAM", 0)


def _descs(cache, block_ids: list[int], dev_id: int) -> list[tuple[int, int, int]]:
    layers, num_blocks, block_bytes = cache.shape
    base = cache.data_ptr()
    return [(base + (layer * num_blocks + b) * block_bytes, block_bytes, dev_id)
            for layer in range(layers) for b in block_ids]


def _digest(cache, block_ids: list[int]) -> str:
    import torch

    idx = torch.tensor(block_ids, dtype=torch.long, device=cache.device)
    return hashlib.sha256(cache.index_select(1, idx).cpu().numpy().tobytes()).hexdigest()


def target(conn, device: str, shape: tuple[int, int, int], src_ids: list[int]) -> None:
    mem, dev_id = _mem(device)
    cache = _cache(device, *shape, seed=1234)
    agent = _agent("dc-target")
    reg = agent.register_memory([(cache.data_ptr(), cache.numel(), dev_id, "")], mem)
    conn.send({"meta": agent.get_agent_metadata(), "descs": _descs(cache, src_ids, dev_id),
               "sha256": _digest(cache, src_ids)})
    while True:  # drain notifications until told to stop (undrained ones hang the initiator)
        agent.get_new_notifs()
        if conn.poll(0.001) and conn.recv() == "stop":
            break
    agent.deregister_memory(reg)
    conn.send("stopped")


def initiator(conn, device: str, shape: tuple[int, int, int], dst_ids: list[int], repeats: int) -> None:
    import torch

    mem, dev_id = _mem(device)
    cache = _cache(device, *shape, seed=None)
    agent = _agent("dc-initiator")
    reg = agent.register_memory([(cache.data_ptr(), cache.numel(), dev_id, "")], mem)
    info = conn.recv()
    peer = agent.add_remote_agent(info["meta"])
    local = _descs(cache, dst_ids, dev_id)
    local_h = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, mem)
    remote_h = agent.prep_xfer_dlist(peer, info["descs"], mem)
    idx = list(range(len(local)))
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        handle = agent.make_prepped_xfer("READ", local_h, idx, remote_h, idx, f"r{i}".encode())
        state = agent.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = agent.check_xfer_state(handle)
        times.append(time.perf_counter() - t0)
        agent.release_xfer_handle(handle)
        if state == "ERR":
            raise RuntimeError("NIXL READ failed")
    got = _digest(cache, dst_ids)
    nbytes = sum(d[1] for d in local)
    # The same bytes copied within this process's device memory: the ceiling a READ is measured against.
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_times = []
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        copy_times.append(time.perf_counter() - t0)
    agent.release_dlist_handle(local_h)
    agent.release_dlist_handle(remote_h)
    agent.remove_remote_agent(peer)
    agent.deregister_memory(reg)
    read_s, copy_s = statistics.median(times[1:]), statistics.median(copy_times[1:])
    conn.send({"bytes_ok": got == info["sha256"], "sha256_expected": info["sha256"], "sha256_got": got,
               "bytes": nbytes, "num_descriptors": len(local), "repeats": repeats,
               "read_first_s": round(times[0], 6), "read_median_s": round(read_s, 6),
               "read_gbps_median": gbps(nbytes, read_s), "read_gbps_best": gbps(nbytes, min(times[1:])),
               "copy_median_s": round(copy_s, 6), "copy_gbps_median": gbps(nbytes, copy_s),
               "copy_kind": f"torch {device} -> {device} copy_, one process"})


def run(device: str, layers: int, num_blocks: int, block_bytes: int, read_blocks: int, repeats: int,
        timeout_s: float) -> dict:
    from services.worker.engines.vllm.ucx import gpu_ucx_env

    ucx = gpu_ucx_env(device == "cuda", os.environ, bool(os.path.isdir("/sys/class/infiniband")
                                                          and os.listdir("/sys/class/infiniband")))
    os.environ.update(ucx.env)  # inherited by both spawned processes, as the worker's engine gets them
    rng = random.Random(0)
    src_ids, dst_ids = rng.sample(range(num_blocks), read_blocks), rng.sample(range(num_blocks), read_blocks)
    shape = (layers, num_blocks, block_bytes)
    ctx = mp.get_context("spawn")
    t_conn, t_child = ctx.Pipe()
    i_conn, i_child = ctx.Pipe()
    procs = [ctx.Process(target=target, args=(t_child, device, shape, src_ids)),
             ctx.Process(target=initiator, args=(i_child, device, shape, dst_ids, repeats))]
    for p in procs:
        p.start()
    try:
        if not t_conn.poll(timeout_s):
            raise RuntimeError(f"target not ready in {timeout_s} s")
        i_conn.send(t_conn.recv())
        if not i_conn.poll(timeout_s):
            raise RuntimeError(f"initiator did not finish in {timeout_s} s")
        result = i_conn.recv()
        t_conn.send("stop")
        t_conn.poll(30) and t_conn.recv()
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    return {**result, "conditions": {
        "device": device, "memory": _mem(device)[0], "layers": layers, "num_blocks": num_blocks,
        "block_bytes": block_bytes, "read_blocks": read_blocks, "processes": "2 (spawn), one device",
        "ucx_env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("UCX_")},
        "ucx_kept_from_user": list(ucx.kept), "ucx_warning": ucx.warning,
        "nixl_agent_config": "enable_prog_thread=False, backends=[]; UCX ucx_error_handling_mode=none"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    # Qwen3-8B-like: 36 layers, one block of 32 tokens x 8 KV heads x 128 x (K+V) x bf16 = 128 KiB per layer.
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--num-blocks", type=int, default=256)
    parser.add_argument("--block-bytes", type=int, default=128 * 1024)
    parser.add_argument("--read-blocks", type=int, default=64, help="blocks per layer READ (64: a 2,048-token prompt)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.device, args.layers, args.num_blocks, args.block_bytes, args.read_blocks, args.repeats,
                 args.timeout_s)
    write_json(args.out, result)
    return 0 if result["bytes_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
