"""The conditions of the machine a benchmark ran on: one ``machine()`` for `splitserve bench` and every issue benchmark.

CPU model, cores (online and available to this process), the SIMD flags that decide engine speed (bf16 and AMX
kernels, AVX-512, AVX2), memory, load average, and the git commit of the checkout that ran it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]  # the checkout: bench/lib/machine.py
# Flags that change what the engines' kernels can do (oneDNN bf16/AMX, AVX-512, AVX2); the full list is ~150 long.
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
              "amx_int8", "neon", "asimd", "sve")


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.split()
    except OSError:
        pass
    return model, flags


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def git_info(repo: Path = REPO) -> dict[str, Any]:
    """Commit of the splitserve checkout this runs from (read-only git calls, no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, env=env,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, env=env, timeout=10).stdout.splitlines()
        return {"commit": commit, "dirty": bool(dirty), "dirty_files": [d[3:] for d in dirty][:50]}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "dirty_files": []}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """{nproc, cpus_available, cpu_model, cpu_flags, mem_gib, hostname, os, python, loadavg, git}."""
    model, flags = _cpuinfo()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    return {"nproc": os.cpu_count(), "cpus_available": cpus, "cpu_model": model or platform.processor(),
            "cpu_flags": [f for f in SIMD_FLAGS if f in flags], "arch": platform.machine(), "mem_gib": _mem_gib(),
            "hostname": platform.node(), "os": platform.platform(), "python": sys.version.split()[0],
            "loadavg": loadavg(), "git": git_info()}
