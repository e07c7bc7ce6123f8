"""NIXL READ (or WRITE) of KV-shaped memory between two processes on one device: bytes checked, GB/s beside a
plain device-to-device copy of the same bytes in one process.

Each process holds a KV cache shaped ``[layers, num_blocks, block_bytes]`` (one region per layer, as vLLM's
NixlConnector registers it) on ``--device`` (cuda: VRAM; cpu: DRAM, the same code, to check it here). READ (a P/D
pull): the target fills its cache with seeded random bytes and the initiator READs ``--read-blocks`` scattered
blocks of every layer (one descriptor per layer-block) into other scattered block ids. WRITE (a push): the
initiator holds the seeded bytes and WRITEs them into the target's blocks. Either way a sha256 of the blocks
that arrived is compared with one of the blocks sent. UCX settings are the worker's (services/worker/engines/vllm/ucx.py), or with ``--ucx
defaults`` UCX's own choice of transports: the two side by side tell whether the worker's list helps or hurts there.

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
    """One descriptor per run of consecutive block ids in each layer (scattered ids: one per layer-block)."""
    layers, num_blocks, block_bytes = cache.shape
    base = cache.data_ptr()
    runs: list[tuple[int, int]] = []  # (first block id, number of blocks)
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return [(base + (layer * num_blocks + first) * block_bytes, n * block_bytes, dev_id)
            for layer in range(layers) for first, n in runs]


def _digest(cache, block_ids: list[int]) -> str:
    import torch

    idx = torch.tensor(block_ids, dtype=torch.long, device=cache.device)
    return hashlib.sha256(cache.index_select(1, idx).cpu().numpy().tobytes()).hexdigest()


def target(conn, device: str, shape: tuple[int, int, int], ids: list[int], poll_s: float, op: str) -> None:
    """The transfer's passive side: holds the bytes a READ takes (seeded), or receives a WRITE's (zeros)."""
    mem, dev_id = _mem(device)
    cache = _cache(device, *shape, seed=1234 if op == "READ" else None)
    agent = _agent("dc-target")
    reg = agent.register_memory([(cache.data_ptr(), cache.numel(), dev_id, "")], mem)
    conn.send({"meta": agent.get_agent_metadata(), "descs": _descs(cache, ids, dev_id),
               "sha256": _digest(cache, ids)})
    # Progress UCX (get_new_notifs) every ``poll_s`` until told to stop, as a worker's progress thread at that
    # delay would (undrained notifications hang the initiator); 0: a busy loop, a thread at delay 0.
    while True:
        agent.get_new_notifs()
        if conn.poll(poll_s):
            msg = conn.recv()
            if msg == "stop":
                break
            if msg == "digest":  # after a WRITE: what arrived
                conn.send(_digest(cache, ids))
    agent.deregister_memory(reg)
    conn.send("stopped")


def initiator(conn, device: str, shape: tuple[int, int, int], dst_ids: list[int], repeats: int, op: str) -> None:
    """The transfer's active side: READs the target's blocks into ``dst_ids``, or WRITEs its own (seeded) blocks
    ``dst_ids`` into the target's."""
    import torch

    mem, dev_id = _mem(device)
    cache = _cache(device, *shape, seed=1234 if op == "WRITE" else None)
    agent = _agent("dc-initiator")
    reg = agent.register_memory([(cache.data_ptr(), cache.numel(), dev_id, "")], mem)
    info = conn.recv()
    peer = agent.add_remote_agent(info["meta"])
    local = _descs(cache, dst_ids, dev_id)
    local_h = agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, mem)
    remote_h = agent.prep_xfer_dlist(peer, info["descs"], mem)
    idx = list(range(len(local)))
    times, post_times, polls = [], [], []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        handle = agent.make_prepped_xfer(op, local_h, idx, remote_h, idx, f"r{i}".encode())
        state = agent.transfer(handle)
        post_times.append(time.perf_counter() - t0)  # inside transfer(): what the engine thread spends posting
        num_polls = 0
        while state not in ("DONE", "ERR"):
            state = agent.check_xfer_state(handle)
            num_polls += 1
        times.append(time.perf_counter() - t0)
        polls.append(num_polls)
        agent.release_xfer_handle(handle)
        if state == "ERR":
            raise RuntimeError(f"NIXL {op} failed")
    # READ: what arrived here against what the target holds; WRITE: what left here (the parent asks the target).
    mine = _digest(cache, dst_ids)
    expected, got = (info["sha256"], mine) if op == "READ" else (mine, "")
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
    conn.send({"op": op, "bytes_ok": got == expected, "sha256_expected": expected, "sha256_got": got,
               "bytes": nbytes, "num_descriptors": len(local), "repeats": repeats,
               "xfer_first_s": round(times[0], 6), "post_median_s": round(statistics.median(post_times[1:]), 6),
               "polls_median": statistics.median(polls[1:]), "xfer_median_s": round(read_s, 6),
               "xfer_gbps_median": gbps(nbytes, read_s), "xfer_gbps_best": gbps(nbytes, min(times[1:])),
               "copy_median_s": round(copy_s, 6), "copy_gbps_median": gbps(nbytes, copy_s),
               "copy_kind": f"torch {device} -> {device} copy_, one process"})


def _wait(conn, procs, timeout_s: float, what: str) -> None:
    """Until ``conn`` has a message; a child that died fails at once (device time is scarce), not at the timeout."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        dead = [f"{p.name} exit {p.exitcode}" for p in procs if p.exitcode is not None]
        if dead:
            raise RuntimeError(f"{what}: {', '.join(dead)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} in {timeout_s} s")


def run(device: str, layers: int, num_blocks: int, block_bytes: int, read_blocks: int, repeats: int,
        timeout_s: float, ucx_choice: str = "worker", contiguous: bool = False, target_poll_s: float = 0.001,
        op: str = "READ") -> dict:
    from services.worker.engines.vllm.ucx import UcxSettings, gpu_ucx_env

    if ucx_choice == "worker":
        ucx = gpu_ucx_env(device == "cuda", os.environ, bool(os.path.isdir("/sys/class/infiniband")
                                                              and os.listdir("/sys/class/infiniband")))
    else:
        ucx = UcxSettings(env={})
    os.environ.update(ucx.env)  # inherited by both spawned processes, as the worker's engine gets them
    rng = random.Random(0)
    if contiguous:  # one run of blocks per layer on each side: one descriptor per layer
        src_ids, dst_ids = list(range(read_blocks)), list(range(num_blocks - read_blocks, num_blocks))
    else:  # scattered, as a cache hands blocks out: one descriptor per layer-block
        src_ids, dst_ids = rng.sample(range(num_blocks), read_blocks), rng.sample(range(num_blocks), read_blocks)
    shape = (layers, num_blocks, block_bytes)
    ctx = mp.get_context("spawn")
    t_conn, t_child = ctx.Pipe()
    i_conn, i_child = ctx.Pipe()
    procs = [ctx.Process(target=target, args=(t_child, device, shape, src_ids, target_poll_s, op)),
             ctx.Process(target=initiator, args=(i_child, device, shape, dst_ids, repeats, op))]
    for p in procs:
        p.start()
    try:
        _wait(t_conn, procs, timeout_s, "target not ready")
        i_conn.send(t_conn.recv())
        _wait(i_conn, procs, timeout_s, "initiator did not finish")
        result = i_conn.recv()
        if op == "WRITE":  # what reached the target
            t_conn.send("digest")
            _wait(t_conn, procs, timeout_s, "target's digest")
            result["sha256_got"] = t_conn.recv()
            result["bytes_ok"] = result["sha256_got"] == result["sha256_expected"]
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
        "block_bytes": block_bytes, "read_blocks": read_blocks, "contiguous": contiguous,
        "target_poll_s": target_poll_s, "processes": "2 (spawn), one device",
        "ucx_choice": ucx_choice, "ucx_env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("UCX_")},
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
    parser.add_argument("--ucx", choices=("worker", "defaults"), default="worker",
                        help="worker: the UCX_TLS a GPU worker sets; defaults: UCX's own choice")
    parser.add_argument("--contiguous", action="store_true",
                        help="move one run of blocks per layer (one descriptor each) instead of scattered blocks")
    parser.add_argument("--target-poll-s", type=float, default=0.001,
                        help="seconds between the target's UCX progress calls (0: busy)")
    parser.add_argument("--op", choices=("READ", "WRITE"), default="READ",
                        help="READ: the initiator pulls the target's blocks (pull); WRITE: it pushes its own")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.device, args.layers, args.num_blocks, args.block_bytes, args.read_blocks, args.repeats,
                 args.timeout_s, args.ucx, args.contiguous, args.target_poll_s, args.op)
    write_json(args.out, result)
    return 0 if result["bytes_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
