"""The kvtier connector's mover on a device: the tests' byte checks, then GB/s of a save (pack on the device +
device -> pinned host on the side stream) and a load (host -> device + unpack) beside a plain pinned copy of the
same bytes.

    python3 scripts/device_check/tier_mover.py --device cuda --out tier_mover.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import dc_common  # noqa: F401 (the repository on sys.path)
from dc_common import gbps, write_json


def _timed(fn, sync, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def run(device: str, layers: int, num_blocks: int, move_blocks: int, repeats: int) -> dict:
    import torch

    from services.worker.engines.vllm.tier.layout import KvLayout
    from services.worker.engines.vllm.tier.mover import TierMover
    from tests.harness import tier_mover_checks as checks

    # Each check's failure is recorded, not raised: one run on a lent machine should still bring back the rest.
    checked: dict[str, bool] = {}
    errors: dict[str, str] = {}

    def check(name: str, fn) -> None:
        try:
            fn()
            checked[name] = True
        except Exception as exc:  # an AssertionError from the byte checks, or a CUDA error
            checked[name], errors[name] = False, repr(exc)[:500]

    for split_kv in (False, True):
        check(f"save_round_trip_split_kv_{split_kv}", lambda: checks.check_save_round_trip(device, split_kv))
        check(f"load_round_trip_split_kv_{split_kv}", lambda: checks.check_load_round_trip(device, split_kv))
        check(f"staged_load_round_trip_split_kv_{split_kv}",
              lambda: checks.check_staged_load_round_trip(device, split_kv))
    check("copy_follows_queued_writes", lambda: checks.check_copy_follows_queued_writes(device))

    # A GPU backend's [2, num_blocks, block_size, kv_heads, head_dim] per layer (K and V split), bf16: 32 tokens x
    # 8 heads x 128 = 64 KiB per K or V slab, 128 KiB per layer-block.
    caches = {f"model.layers.{i}.self_attn.attn": torch.randn((2, num_blocks, 32, 8, 128), device=device)
              .to(torch.bfloat16) for i in range(layers)}
    layout = KvLayout.from_kv_caches(caches, num_blocks)
    mover = TierMover(device)
    ids = list(range(0, 2 * move_blocks, 2))[:move_blocks]  # scattered, as a cache hands blocks out
    nbytes = len(ids) * layout.block_bytes
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    host_blocks = mover.to_host(layout.pack(ids)).wait().clone()
    save_s = _timed(lambda: mover.to_host(layout.pack(ids)).wait(), sync, repeats)
    # A load as the loader does it: kvtier's reply holds one bytes object per block, staged (pinned) once.
    fetched = [host_blocks[i].numpy().tobytes() for i in range(len(ids))]
    load_s = _timed(lambda: layout.unpack(ids, mover.to_device(mover.stage(fetched, layout.block_bytes))), sync,
                    repeats)
    # The same from one pageable tensor (to_device pins it with a copy first): the loader before staging, less
    # the join of the blocks it also made.
    load_pageable_s = _timed(lambda: layout.unpack(ids, mover.to_device(host_blocks)), sync, repeats)
    # The plain copies of the same bytes, pinned host <-> one contiguous device tensor.
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    d2h_s = _timed(lambda: pinned.copy_(flat, non_blocking=True), sync, repeats)
    h2d_s = _timed(lambda: flat.copy_(pinned, non_blocking=True), sync, repeats)
    return {"bytes_ok": all(checked.values()), "checks": checked, "errors": errors, "bytes": nbytes, "num_blocks_moved": len(ids),
            "block_bytes": layout.block_bytes, "repeats": repeats,
            "save_gbps": gbps(nbytes, save_s), "load_gbps": gbps(nbytes, load_s),
            "load_pageable_tensor_gbps": gbps(nbytes, load_pageable_s),
            "pinned_d2h_gbps": gbps(nbytes, d2h_s), "pinned_h2d_gbps": gbps(nbytes, h2d_s),
            "save_median_s": round(save_s, 6), "load_median_s": round(load_s, 6),
            "conditions": {"device": device, "layers": layers, "cache_blocks": num_blocks,
                           "layout": "[2, blocks, 32, 8, 128] bf16 per layer",
                           "save": "KvLayout.pack on the device + TierMover.to_host (side stream) + wait",
                           "load": "TierMover.stage (one bytes per block into pinned rows) + to_device (side stream) + KvLayout.unpack",
                           "torch": torch.__version__, "cuda": torch.version.cuda}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--num-blocks", type=int, default=512)
    parser.add_argument("--move-blocks", type=int, default=64, help="blocks per save / load (64: 2,048 tokens)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.device, args.layers, args.num_blocks, args.move_blocks, args.repeats)
    write_json(args.out, result)
    return 0 if result["bytes_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
