"""`--gpus` on `up` and `worker`: the device list as typed, checked against `nvidia-smi -L`, and `up`'s placement
of its engines on it (cli/placement.py decides; this module reads the machine and turns refusals into exit 2)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

import typer

from cli.placement import Placement, PlacementError, PoolDemand, parse_devices, parse_nvidia_smi_list, place

GPUS_HELP = ("GPUs for the engines: 0-7 | 0,1,3 | all (as `nvidia-smi -L` numbers them); each engine gets its "
             "tensor x pipeline parallel devices as CUDA_VISIBLE_DEVICES (docs/gpus.md)")


def listed_gpus(timeout_s: float = 20.0) -> tuple[int, ...] | None:
    """Device ids `nvidia-smi -L` lists; None when there is no nvidia-smi or it fails (no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        result = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi_list(result.stdout) if result.returncode == 0 else None


def devices_option(text: str) -> tuple[int, ...]:
    """``--gpus`` as device ids, or a one-line error and exit 2."""
    try:
        return parse_devices(text, listed_gpus())
    except PlacementError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def pool_demand(role: str, num_engines: int, given: Mapping[str, object]) -> PoolDemand:
    """A pool's needs from its parsed vLLM engine arguments (``EngineArgs.given``: vLLM's dest names)."""
    fraction = given.get("gpu_memory_utilization")
    return PoolDemand(role=role, num_engines=num_engines,
                      tensor_parallel=int(given.get("tensor_parallel_size", 1)),  # type: ignore[call-overload]
                      pipeline_parallel=int(given.get("pipeline_parallel_size", 1)),  # type: ignore[call-overload]
                      gpu_memory_utilization=float(fraction) if fraction is not None else None)  # type: ignore[arg-type]


def placement_or_exit(devices: tuple[int, ...], pools: list[PoolDemand]) -> Placement:
    try:
        return place(devices, pools)
    except PlacementError as exc:
        typer.echo(f"error: --gpus: {exc}", err=True)
        raise typer.Exit(2) from exc


def engine_on_cuda(devices: tuple[int, ...] | None, environ: Mapping[str, str]) -> bool:
    """Will this worker's engine run on a GPU: devices placed, or a driver here and devices not hidden."""
    if devices:
        return True
    return devices is None and shutil.which("nvidia-smi") is not None and environ.get("CUDA_VISIBLE_DEVICES") != ""


def has_rdma_device(sys_root: str = "/sys/class/infiniband") -> bool:
    """An InfiniBand / RoCE device here (UCX's rc transport needs one)."""
    import os

    try:
        return bool(os.listdir(sys_root))
    except OSError:
        return False
