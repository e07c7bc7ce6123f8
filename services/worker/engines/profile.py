"""Profile an engine through the ``Engine`` protocol (``splitserve profile``); ``common.profile`` fits and
writes the document.

What is measured (on an otherwise idle engine, prefix caching defeated by random prompts):

- prefill: seconds from submitting one prompt of ``n`` tokens with ``max_tokens=1`` to its only token, for
  ``n`` across ``prefill_lengths`` (median of ``prefill_repeats``). The engine runs with
  ``max_num_batched_tokens`` >= the longest prompt, so each sample is one engine step: the per-step
  polynomial ``TimingModel.prefill_s`` is fitted to it directly.
- decode: ``batch`` requests of ``context`` prompt tokens each, ``decode_tokens`` output tokens each, all
  submitted at once; once every request has its first token, step seconds = time between a request's
  outputs / tokens between them (robust to outputs merged by a slow consumer), median over requests. Two
  sweeps: batch across ``decode_batches`` at ``decode_batch_context`` tokens of context, and context across
  ``decode_contexts`` at ``decode_context_batch`` sequences (a cross, not a full grid: the prompts of a
  full grid would take most of the time budget to prefill).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.profile import build_document
from common.protocol import SamplingParams
from common.timing import TimingModel
from services.worker.engine import Engine, EngineRequest


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    prefill_lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096)
    prefill_repeats: int = 3
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_batch_context: int = 128
    decode_contexts: tuple[int, ...] = (512, 1024, 2048)
    decode_context_batch: int = 8
    decode_tokens: int = 32
    # Each decode point is run this many times; the median step is kept (shared machines are noisy).
    decode_repeats: int = 3
    # Requests run (unmeasured) first: engine warm-up, allocator, first-call costs.
    warmup_requests: int = 2
    # Soft budget: a sweep point that would start after this is skipped and the profile marked truncated.
    max_seconds: float = 600.0
    seed: int = 0

    @property
    def max_prompt_tokens(self) -> int:
        return max((*self.prefill_lengths, self.decode_batch_context, *self.decode_contexts))

    @property
    def max_batch(self) -> int:
        return max((*self.decode_batches, self.decode_context_batch))


QUICK = ProfileSpec(
    prefill_lengths=(32, 128, 512, 1024, 2048, 4096),
    prefill_repeats=2,
    decode_batches=(1, 4, 16, 64),
    decode_batch_context=128,
    decode_contexts=(512, 2048),
    decode_context_batch=4,
    decode_tokens=16,
    decode_repeats=2,
    warmup_requests=1,
    max_seconds=150.0,
)


def clip_spec(spec: ProfileSpec, max_model_len: int) -> ProfileSpec:
    """Prompt lengths that fit the engine: prompt + outputs <= max_model_len (duplicates dropped)."""
    limit_prefill = max_model_len - 1
    limit_decode = max_model_len - spec.decode_tokens
    prefill = tuple(sorted({min(n, limit_prefill) for n in spec.prefill_lengths}))
    contexts = tuple(sorted({min(n, limit_decode) for n in spec.decode_contexts}))
    return replace(spec, prefill_lengths=prefill, decode_contexts=contexts,
                   decode_batch_context=min(spec.decode_batch_context, limit_decode))


# ------------------------------------------------------------------------------------------ measuring


class _Prompts:
    """Random prompts, so no prompt hits another's prefix cache."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._vocab = vocab_size
        self._n = 0

    def request(self, num_tokens: int, max_tokens: int) -> EngineRequest:
        self._n += 1
        tokens = self._rng.integers(1, self._vocab, num_tokens)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return EngineRequest(f"profile-{self._n}", tuple(int(t) for t in tokens), sampling)


async def _run(engine: Engine, request: EngineRequest) -> list[tuple[float, int]]:
    """(time, tokens so far) at each output of one request."""
    points: list[tuple[float, int]] = []
    num_tokens = 0
    async for out in engine.generate(request):
        num_tokens += len(out.token_ids)
        points.append((time.perf_counter(), num_tokens))
        if out.finish_reason is not None:
            break
    return points


async def measure_prefill_s(engine: Engine, prompts: _Prompts, num_tokens: int) -> float:
    began = time.perf_counter()
    await _run(engine, prompts.request(num_tokens, 1))
    return time.perf_counter() - began


async def measure_decode_step_s(engine: Engine, prompts: _Prompts, batch: int, context: int,
                                decode_tokens: int) -> float:
    runs = await asyncio.gather(*(_run(engine, prompts.request(context, decode_tokens)) for _ in range(batch)))
    all_started = max(points[0][0] for points in runs)
    steps: list[float] = []
    for points in runs:
        after = [p for p in points if p[0] >= all_started]
        (t_a, n_a), (t_b, n_b) = after[0], after[-1]
        if n_b > n_a:
            steps.append((t_b - t_a) / (n_b - n_a))
    if not steps:
        raise RuntimeError(f"decode point batch={batch} context={context}: no step measured "
                           f"(decode_tokens={decode_tokens} too small?)")
    return statistics.median(steps)


async def measure(engine: Engine, spec: ProfileSpec, vocab_size: int,
                  log: Any = None) -> dict[str, Any]:
    """Run the sweeps on a started engine; the ``prefill``/``decode`` samples and timing facts."""
    prompts = _Prompts(vocab_size, spec.seed)
    loadavg_before = list(os.getloadavg())
    began = time.perf_counter()
    deadline = began + spec.max_seconds
    truncated = False

    def say(msg: str) -> None:
        if log is not None:
            log(msg)

    for _ in range(spec.warmup_requests):
        await _run(engine, prompts.request(min(spec.prefill_lengths), 4))
    prefill: list[dict[str, Any]] = []
    for n in spec.prefill_lengths:
        if time.perf_counter() > deadline:
            truncated = True
            break
        seconds = [await measure_prefill_s(engine, prompts, n) for _ in range(spec.prefill_repeats)]
        prefill.append({"num_tokens": n, "seconds": statistics.median(seconds), "all_seconds": seconds})
        say(f"prefill {n:5d} tokens: {statistics.median(seconds) * 1e3:9.2f} ms")
    points = [(b, spec.decode_batch_context) for b in spec.decode_batches]
    points += [(spec.decode_context_batch, c) for c in spec.decode_contexts
               if (spec.decode_context_batch, c) not in points]
    decode: list[dict[str, Any]] = []
    for batch, context in points:
        if time.perf_counter() > deadline:
            truncated = True
            break
        steps = [await measure_decode_step_s(engine, prompts, batch, context, spec.decode_tokens)
                 for _ in range(spec.decode_repeats)]
        step_s = statistics.median(steps)
        decode.append({"batch": batch, "context": context,
                       "mean_context": context + spec.decode_tokens / 2, "step_s": step_s, "all_step_s": steps})
        say(f"decode batch {batch:3d} context {context:5d}: {step_s * 1e3:8.2f} ms/step "
            f"({batch / step_s:8.1f} tok/s)")
    return {"prefill": prefill, "decode": decode, "elapsed_s": time.perf_counter() - began,
            "truncated": truncated, "loadavg_before": loadavg_before}


# ----------------------------------------------------------------------------------------- engines


async def profile_mock(spec: ProfileSpec, timing: TimingModel | None = None, block_size: int = 16,
                       log: Any = None) -> dict[str, Any]:
    """Profile a mock engine in-process (tests, and to check the pipeline end to end)."""
    from services.worker.engines.mock.config import MockEngineConfig
    from services.worker.engines.mock.engine import MockEngine

    timing = timing or TimingModel()
    max_len = spec.max_prompt_tokens + spec.decode_tokens + 1
    batched = max(spec.max_prompt_tokens, 2048)
    blocks_needed = spec.max_batch * (-(-max_len // block_size)) + 64
    config = MockEngineConfig(num_blocks=max(blocks_needed, 1024), block_size=block_size,
                              max_num_seqs=spec.max_batch, max_num_batched_tokens=batched,
                              max_model_len=max_len, timing=timing)
    engine = MockEngine(config)
    await engine.start()
    try:
        samples = await measure(engine, spec, config.vocab_size, log)
    finally:
        await engine.shutdown()
    conditions = {"engine": "mock", "model": "mock", "dtype": "n/a", "block_size": block_size,
                  "num_blocks": config.num_blocks, "max_num_seqs": config.max_num_seqs,
                  "max_num_batched_tokens": batched, "max_model_len": max_len,
                  "kv_bytes_per_token": config.kv_bytes_per_token,
                  "mock_timing": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(timing).items()}}
    return build_document(samples, conditions, spec)


def vllm_config_for(model: Path, spec: ProfileSpec, dtype: str = "auto", block_size: int = 32,
                    kv_cache_gib: int = 1) -> Any:
    """The VllmEngineConfig a profile runs: no connector, no prefix cache, one step per prompt."""
    from common.tiny_model import validate_model_dir
    from services.worker.engines.vllm.config import VllmEngineConfig

    info = validate_model_dir(model)
    max_len = min(info.max_position_embeddings, 8192)
    return VllmEngineConfig(model=model, dtype=dtype, block_size=block_size,  # type: ignore[arg-type]
                            max_model_len=max_len, max_num_seqs=max(spec.max_batch, 1),
                            max_num_batched_tokens=max(clip_spec(spec, max_len).max_prompt_tokens, 2048),
                            kv_role=None, kv_cache_space_gib=kv_cache_gib, enable_prefix_caching=False)


async def profile_vllm(config: Any, spec: ProfileSpec, log: Any = None) -> dict[str, Any]:
    """Profile one VllmEngine in this process. The caller sets the environment first
    (``engine_process_env``: LD_PRELOAD before the process starts, one core)."""
    from services.worker.engines.vllm.engine import VllmEngine

    engine = VllmEngine(config)
    await engine.start()
    try:
        info = engine.model_info
        assert info is not None
        spec = clip_spec(spec, engine.max_model_len)
        samples = await measure(engine, spec, info.vocab_size, log)
        model_config = engine._llm.vllm_config.model_config  # noqa: SLF001 (resolved dtype, for the record)
        dtype = str(model_config.dtype).removeprefix("torch.")
        try:
            import vllm

            vllm_version = vllm.__version__
        except Exception:  # noqa: BLE001
            vllm_version = "?"
        conditions = {"engine": "vllm", "vllm_version": vllm_version, "model": str(config.model),
                      "model_name": Path(config.model).resolve().name,
                      "model_shape": {"hidden": info.hidden_size, "layers": info.num_layers,
                                      "heads": info.num_heads, "kv_heads": info.num_kv_heads},
                      "dtype": dtype, "block_size": engine.block_size, "num_blocks": engine.num_blocks,
                      "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                      "max_model_len": engine.max_model_len, "enforce_eager": config.enforce_eager,
                      "kv_bytes_per_token": info.kv_bytes_per_token(model_config.dtype.itemsize),
                      "engine_start_s": round(engine.start_s, 2)}
    finally:
        await engine.shutdown()
    return build_document(samples, conditions, spec)
