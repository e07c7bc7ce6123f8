"""Which dtype a vLLM engine computes in: ``--dtype auto`` must not mean bf16 on a CPU that emulates it.

vLLM 0.32's ``auto`` takes the model's ``torch_dtype`` (a float32 model: bf16), and its CPU backend runs bf16 on
any x86 CPU. Without
AVX512-BF16 or AMX the matmuls are emulated: measured here (AMD EPYC, AVX2 only), a (2000 x 768) @ (768 x 3072)
matmul on one core took 12.8 s in bf16 and 0.40 s in fp32, and a 1P + 1D graph of the 100M model served a
2,000-token prompt in about a minute. So ``auto`` on such a CPU means float32; an explicit dtype is kept.
Every worker of a graph resolves the same way on the same kind of CPU (prefill and decode must agree: the
KV they exchange has the engine's dtype); across kinds of CPU, pass ``--dtype`` explicitly.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

HALF_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: str  # what vLLM is given: "auto" (vLLM decides), "float32", "bfloat16"
    reason: str
    emulated: bool = False  # the CPU has no native kernels for it (slow)


def choose_dtype(requested: str, model_dtype: str, on_cuda: bool, cpu_has_fast_bf16: bool) -> DtypeChoice:
    if requested != "auto":
        if requested in HALF_DTYPES and not on_cuda and not cpu_has_fast_bf16:
            return DtypeChoice(requested, "as asked; this CPU emulates it (no AVX512-BF16/AMX): expect ~30x slower "
                                          "matmuls than float32", emulated=True)
        return DtypeChoice(requested, "as asked")
    if on_cuda:
        return DtypeChoice("auto", "vLLM's choice for the GPU")
    if model_dtype in HALF_DTYPES and not cpu_has_fast_bf16:
        return DtypeChoice("float32", f"the model is {model_dtype}, which this CPU emulates (no AVX512-BF16/AMX)")
    if model_dtype in ("float32", "float") and not cpu_has_fast_bf16:
        # vLLM's `auto` downcasts a float32 model to its platform's first dtype, bf16 on x86 CPUs (0.32,
        # _resolve_auto_dtype): emulated here.
        return DtypeChoice("float32", "the model is float32; vLLM's auto would run it in bf16, which this CPU "
                                      "emulates (no AVX512-BF16/AMX)")
    return DtypeChoice("auto", f"the model's {model_dtype}")


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """x86: AVX512-BF16 or AMX (what oneDNN's bf16 kernels use), from the kernel's CPU flags (no torch import:
    the launcher sizes kvtier slots with this too). Other CPUs: left to vLLM (True)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    try:
        text = cpuinfo.read_text()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolved_dtype(requested: str, model_dtype: str, on_cuda: bool) -> DtypeChoice:
    """``choose_dtype`` for this machine."""
    return choose_dtype(requested, model_dtype, on_cuda, on_cuda or cpu_has_fast_bf16())
