"""The placement's CUDA_VISIBLE_DEVICES against the real machine: for each engine `up --gpus` would start, a
process with that engine's environment must see exactly its devices (UUIDs as `nvidia-smi -L` lists them), and a
control-plane service's environment no device at all.

    python3 scripts/device_check/placement_env.py --out placement_env.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import dc_common  # noqa: F401 (the repository on sys.path)
from dc_common import write_json

from cli.placement import PoolDemand, control_plane_env, parse_devices, parse_nvidia_smi_list, place

PROBE = ("import json, torch; n = torch.cuda.device_count(); props = [torch.cuda.get_device_properties(i) "
         "for i in range(n)]; print(json.dumps({'count': n, 'uuids': [str(getattr(p, 'uuid', '')) for p in props], "
         "'names': [p.name for p in props]}))")


def nvidia_smi_uuids(listing: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^GPU (\d+):.*\(UUID: GPU-([0-9a-fA-F-]+)\)", listing,
                                                              re.M)}


def _hex(uuid: str) -> str:
    """A UUID as hex digits only: torch prints it bare, nvidia-smi with GPU- and dashes."""
    return re.sub(r"[^0-9a-f]", "", uuid.lower().removeprefix("gpu-"))


def probe(extra_env: dict[str, str], timeout_s: float) -> dict:
    env = {**os.environ, **extra_env}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        return {"count": -1, "error": out.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def cases(devices: tuple[int, ...]) -> dict[str, list[PoolDemand]]:
    """The docs' placements that fit this machine."""
    out = {"1P+1D on one GPU": [PoolDemand("prefill", 1), PoolDemand("decode", 1)]}
    if len(devices) >= 2:
        out["1P+1D on their own GPUs"] = [PoolDemand("prefill", 1), PoolDemand("decode", 1)]
    if len(devices) >= 8:
        out["2P TP2 + 4D"] = [PoolDemand("prefill", 2, tensor_parallel=2), PoolDemand("decode", 4)]
    return out


def run(timeout_s: float) -> dict:
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=timeout_s).stdout
    available = parse_nvidia_smi_list(listing)
    uuids = nvidia_smi_uuids(listing)
    devices = parse_devices("all", available)
    results, ok = [], True
    for name, pools in cases(devices).items():
        on = devices[:1] if name.endswith("one GPU") else devices
        placement = place(on, pools)
        for engine in placement.engines:
            seen = probe({"CUDA_VISIBLE_DEVICES": engine.cuda_visible_devices}, timeout_s)
            want = [uuids.get(d, "") for d in engine.devices]
            match = seen.get("count") == len(engine.devices) and (
                not all(want) or [_hex(u) for u in seen.get("uuids", [])] == [_hex(u) for u in want])
            ok &= match
            results.append({"case": name, "role": engine.role, "CUDA_VISIBLE_DEVICES": engine.cuda_visible_devices,
                            "gpu_memory_utilization": engine.gpu_memory_utilization, "expected_uuids": want,
                            "seen": seen, "ok": match})
    control = probe(control_plane_env("router"), timeout_s)
    control_ok = control.get("count") == 0
    return {"ok": ok and control_ok, "nvidia_smi_L": listing.strip().splitlines(), "devices": list(devices),
            "engines": results, "control_plane": {"env": control_plane_env("router"), "seen": control,
                                                  "ok": control_ok}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per probe process")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run(args.timeout_s)
    write_json(args.out, result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
