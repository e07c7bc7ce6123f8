"""Which GPUs each engine of a graph runs on (pure): `up --gpus 0-7` and `worker --gpus 0,1`.

Each engine needs tensor-parallel x pipeline-parallel devices (its pool's vLLM arguments ``-tp``/``-pp``). When
the devices given hold every engine's, each engine gets its own, the largest engines first so that a TP group
takes aligned neighbours (0-1, 2-3: NVLink pairs on most boards). When they do not, engines share: every engine
must then be the same size and that size must divide the devices, and the engines are dealt round-robin over the
groups; engines sharing a device split its memory (vLLM's ``--gpu-memory-utilization``, 0.9 of a device by
default) in equal fractions, unless the user gave their own. Refusals are ``PlacementError`` with the reason.

An engine's devices become its process's CUDA_VISIBLE_DEVICES (the worker sets it); the control-plane services
(router, frontend, kvtier, planner) get CUDA_VISIBLE_DEVICES="" (``control_plane_env``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's own default share of a device's memory for one engine.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
CONTROL_PLANE_SERVICES = frozenset({"router", "frontend", "kvtier", "planner"})


class PlacementError(ValueError):
    """A placement that cannot be made: too few devices, uneven groups, a bad device list."""


@dataclass(frozen=True, slots=True)
class PoolDemand:
    """One pool's engines and what each needs, from its vLLM engine arguments."""

    role: str  # prefill | decode | both
    num_engines: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    gpu_memory_utilization: float | None = None  # the user's own value; None: the placement's

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True, slots=True)
class EnginePlacement:
    role: str
    devices: tuple[int, ...]
    # The share of each device's memory the placement gives the engine (`--gpu-memory-utilization`); None: vLLM's
    # default (the engine has its devices alone) or the user's own value (already in its arguments).
    gpu_memory_utilization: float | None = None

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass(frozen=True, slots=True)
class Placement:
    engines: tuple[EnginePlacement, ...]  # in pool order, as worker_roles lists the workers
    shared: bool = False  # some devices run more than one engine

    def for_role(self, role: str) -> tuple[EnginePlacement, ...]:
        return tuple(e for e in self.engines if e.role == role)


def parse_devices(text: str, available: Sequence[int] | None = None) -> tuple[int, ...]:
    """``0-7`` | ``0,1,3`` | ``2,4-5`` | ``all`` -> device ids, in order, each once. ``available``: the ids
    `nvidia-smi -L` lists (None: unknown, no check; required for ``all``)."""
    text = text.strip()
    if text == "all":
        if available is None:
            raise PlacementError("--gpus all: no GPU found (`nvidia-smi -L` is missing or lists none)")
        if not available:
            raise PlacementError("--gpus all: `nvidia-smi -L` lists no GPU")
        return tuple(available)
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise PlacementError(f"--gpus {text!r}: {part!r} is not a device id or a range (e.g. 0-7, 0,1,3, all)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise PlacementError(f"--gpus {text!r}: the range {part!r} runs backwards")
        for device in range(first, last + 1):
            if device in ids:
                raise PlacementError(f"--gpus {text!r}: device {device} is named twice")
            ids.append(device)
    if available is not None:
        missing = [d for d in ids if d not in available]
        if missing:
            raise PlacementError(f"--gpus {text!r}: no device {', '.join(map(str, missing))} on this machine "
                                 f"(nvidia-smi lists {', '.join(map(str, available)) or 'none'})")
    return tuple(ids)


def parse_nvidia_smi_list(output: str) -> tuple[int, ...]:
    """Device ids from `nvidia-smi -L` ("GPU 0: NVIDIA H200 (UUID: GPU-...)", MIG lines indented under them)."""
    return tuple(int(m.group(1)) for m in re.finditer(r"^GPU (\d+):", output, re.M))


def place(devices: Sequence[int], pools: Sequence[PoolDemand]) -> Placement:
    """Every engine of ``pools`` (in order) on ``devices``; raises ``PlacementError``."""
    devices = tuple(devices)
    if not devices:
        raise PlacementError("no GPU to place engines on")
    wanted = [p for p in pools if p.num_engines > 0]
    for pool in wanted:
        if pool.tensor_parallel < 1 or pool.pipeline_parallel < 1:
            raise PlacementError(f"{pool.role}: tensor x pipeline parallel {pool.tensor_parallel} x "
                                 f"{pool.pipeline_parallel} must be at least 1 x 1")
        if pool.world_size > len(devices):
            raise PlacementError(f"{pool.role}: one engine needs {pool.world_size} GPUs (tensor x pipeline "
                                 f"parallel {pool.tensor_parallel} x {pool.pipeline_parallel}), only "
                                 f"{len(devices)} given ({_names(devices)})")
    demand = [(p.role, p) for p in wanted for _ in range(p.num_engines)]
    needed = sum(p.world_size for _, p in demand)
    if needed <= len(devices):
        return Placement(_exclusive(devices, demand))
    sizes = {p.world_size for _, p in demand}
    if len(sizes) > 1:
        raise PlacementError(f"{len(demand)} engines need {needed} GPUs, only {len(devices)} given "
                             f"({_names(devices)}); engines can share GPUs only when all have one tensor x "
                             f"pipeline size (here {', '.join(map(str, sorted(sizes)))})")
    size = sizes.pop()
    if len(devices) % size:
        raise PlacementError(f"{len(demand)} engines of {size} GPUs each on {len(devices)} GPUs "
                             f"({_names(devices)}): uneven, {len(devices)} is not a multiple of {size}")
    return Placement(_shared(devices, demand, size), shared=True)


def _exclusive(devices: tuple[int, ...], demand: list[tuple[str, PoolDemand]]) -> tuple[EnginePlacement, ...]:
    # Largest first (stable): TP groups of 2 take 0-1, 2-3 before single engines fill the rest.
    order = sorted(range(len(demand)), key=lambda i: -demand[i][1].world_size)
    out: list[EnginePlacement | None] = [None] * len(demand)
    next_device = 0
    for i in order:
        role, pool = demand[i]
        out[i] = EnginePlacement(role, devices[next_device:next_device + pool.world_size])
        next_device += pool.world_size
    return tuple(e for e in out if e is not None)


def _shared(devices: tuple[int, ...], demand: list[tuple[str, PoolDemand]],
            size: int) -> tuple[EnginePlacement, ...]:
    groups = [devices[g:g + size] for g in range(0, len(devices), size)]
    per_group = [0] * len(groups)
    for i in range(len(demand)):
        per_group[i % len(groups)] += 1
    out = []
    for i, (role, pool) in enumerate(demand):
        group = i % len(groups)
        # Equal shares of vLLM's 0.9, rounded down to a hundredth (2 engines: 0.45 each).
        share = math.floor(VLLM_GPU_MEMORY_UTILIZATION / per_group[group] * 100) / 100
        out.append(EnginePlacement(role, groups[group], None if pool.gpu_memory_utilization else share))
    for group, members in enumerate(groups):
        asked = sum(e.gpu_memory_utilization or p.gpu_memory_utilization or 0.0
                    for e, (_, p) in zip(out, demand) if e.devices == members)
        if asked > 1.0 + 1e-9:
            raise PlacementError(f"the engines sharing GPU {_names(members)} ask for {asked:.2f} of its memory "
                                 f"(--gpu-memory-utilization): at most 1.0 in all")
    return tuple(out)


def _names(devices: Sequence[int]) -> str:
    return ",".join(map(str, devices))


def control_plane_env(service: str) -> dict[str, str]:
    """What `up` adds to a service's environment: no GPU for the control plane (a CUDA context there would take
    memory from an engine's device), nothing for workers (each sets its own from --gpus)."""
    return {"CUDA_VISIBLE_DEVICES": ""} if service in CONTROL_PLANE_SERVICES else {}
