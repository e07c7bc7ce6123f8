"""choose_dtype: `auto` never means an emulated bf16 on a CPU; an explicit dtype is kept."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from services.worker.engines.vllm.dtype import (
    DtypeChoice,
    choose_dtype,
    cpu_has_fast_bf16,
)


@pytest.mark.parametrize(
    ("requested", "model_dtype", "on_cuda", "fast_bf16", "dtype", "emulated"),
    [
        ("auto", "bfloat16", False, False, "float32", False),  # AVX2-only CPU: fp32 instead
        ("auto", "float16", False, False, "float32", False),
        ("auto", "bfloat16", False, True, "auto", False),  # AVX512-BF16/AMX: the model's bf16
        ("auto", "float32", False, False, "float32", False),  # vLLM's auto would downcast it to emulated bf16
        ("auto", "float32", False, True, "auto", False),  # ... which is native here
        ("auto", "bfloat16", True, False, "auto", False),  # GPUs: vLLM's choice
        ("bfloat16", "float32", False, False, "bfloat16", True),  # asked for: kept, flagged slow
        ("bfloat16", "float32", True, False, "bfloat16", False),
        ("float32", "bfloat16", False, True, "float32", False),
    ],
)
def test_choose_dtype(requested: str, model_dtype: str, on_cuda: bool, fast_bf16: bool, dtype: str,
                      emulated: bool) -> None:
    choice = choose_dtype(requested, model_dtype, on_cuda, fast_bf16)
    assert isinstance(choice, DtypeChoice)
    assert (choice.dtype, choice.emulated) == (dtype, emulated)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 CPU flags")
@pytest.mark.parametrize(("flags", "fast"), [("fpu sse2 avx2 fma", False), ("avx2 avx512f avx512_bf16", True),
                                             ("avx2 avx512f amx_tile amx_bf16", True)])
def test_fast_bf16_from_cpu_flags(tmp_path: Path, flags: str, fast: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_has_fast_bf16(cpuinfo) is fast
