"""Profile an engine through the ``Engine`` protocol, and fit the mock's ``TimingModel`` to the result.

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

The fit (``fit_timing``) minimises *relative* error (weights 1/seconds), so short prompts are fitted as
well as long ones, and drops a term whose coefficient comes out negative (a non-negative fit, by hand).
Decode is fitted to ``base + per_seq * batch + per_kv_token * batch * mean_context`` (the mock's form),
with mean_context = prompt + half the decode tokens.

The JSON (``PROFILE_KIND``, version 1) holds ``conditions``, the raw ``prefill`` and ``decode`` samples,
``timing`` (TimingModel field names, so ``TimingModel.from_profile(doc["timing"])`` works) and ``fit``
(the fitted model's worst relative error per curve). ``load_timing`` reads it for ``--mock-profile``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.protocol import SamplingParams
from services.worker.engine import Engine, EngineRequest
from common.timing import TimingModel

PROFILE_KIND = "splitserve.profile"
PROFILE_VERSION = 1


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


# ------------------------------------------------------------------------------------------- fitting


def _nonneg_weighted_lstsq(columns: list[np.ndarray], y: np.ndarray) -> list[float]:
    """Least squares of relative error (rows weighted 1/y); a negative coefficient's term is dropped."""
    active = list(range(len(columns)))
    weights = 1.0 / np.maximum(y, 1e-12)
    while True:
        a = np.stack([columns[i] for i in active], axis=1) * weights[:, None]
        sol, *_ = np.linalg.lstsq(a, y * weights, rcond=None)
        if (sol >= 0).all() or len(active) == 1:
            coeffs = [0.0] * len(columns)
            for i, c in zip(active, sol):
                coeffs[i] = max(float(c), 0.0)
            return coeffs
        del active[int(np.argmin(sol))]


def fit_timing(prefill: Sequence[Mapping[str, Any]], decode: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TimingModel fields fitted to profile samples (only the curves that have samples)."""
    fields: dict[str, Any] = {}
    if len(prefill) >= 1:
        n = np.array([float(p["num_tokens"]) for p in prefill])
        y = np.array([float(p["seconds"]) for p in prefill])
        cols = [np.ones_like(n), n, n * n][: max(1, min(3, len(prefill)))]
        coeffs = _nonneg_weighted_lstsq(cols, y)
        fields["prefill_coeffs_s"] = tuple(coeffs + [0.0] * (3 - len(coeffs)))
    if len(decode) >= 1:
        b = np.array([float(d["batch"]) for d in decode])
        kv = b * np.array([float(d["mean_context"]) for d in decode])
        y = np.array([float(d["step_s"]) for d in decode])
        cols = [np.ones_like(b), b, kv][: max(1, min(3, len(decode)))]
        base, per_seq, per_kv = (_nonneg_weighted_lstsq(cols, y) + [0.0, 0.0])[:3]
        fields.update(decode_base_s=base, decode_per_seq_s=per_seq, decode_per_kv_token_s=per_kv)
    return fields


def fit_errors(timing: TimingModel, prefill: Sequence[Mapping[str, Any]],
               decode: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Worst relative error of the fitted model against each curve's samples."""
    def worst(pairs: list[tuple[float, float]]) -> float:
        return max((abs(model - seen) / seen for model, seen in pairs), default=0.0)

    return {
        "prefill_max_rel_err": worst([(timing.prefill_s(p["num_tokens"]), p["seconds"]) for p in prefill]),
        "decode_max_rel_err": worst([(timing.decode_s(d["batch"], d["batch"] * d["mean_context"]), d["step_s"])
                                     for d in decode]),
    }


# ----------------------------------------------------------------------------------------- documents


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts: dict[str, Any] = {"hostname": platform.node(), "arch": platform.machine(), "cpu_model": cpu_model,
                             "nproc": os.cpu_count(), "cpus_available": len(os.sched_getaffinity(0)),
                             "python": sys.version.split()[0], "loadavg": list(os.getloadavg())}
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE"):
        if key in os.environ:
            facts[key] = os.environ[key]
    facts["ld_preload_libgomp"] = "libgomp" in os.environ.get("LD_PRELOAD", "")
    return facts


def build_document(samples: Mapping[str, Any], conditions: Mapping[str, Any], spec: ProfileSpec) -> dict[str, Any]:
    timing_fields = fit_timing(samples["prefill"], samples["decode"])
    timing = TimingModel.from_profile(timing_fields)
    return {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        "conditions": {**conditions, "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "machine": {**machine_facts(), "loadavg_before": samples.get("loadavg_before")},
                       "spec": asdict(spec),
                       "elapsed_s": round(samples["elapsed_s"], 3), "truncated": samples["truncated"]},
        "prefill": list(samples["prefill"]),
        "decode": list(samples["decode"]),
        "timing": {k: list(v) if isinstance(v, tuple) else v for k, v in timing_fields.items()},
        "fit": fit_errors(timing, samples["prefill"], samples["decode"]),
    }


def load_profile(path: Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a profile is a JSON object")
    return doc


def timing_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """TimingModel fields of a profile document; a flat dict of TimingModel fields passes through."""
    if doc.get("kind") == PROFILE_KIND:
        return dict(doc["timing"])
    return dict(doc)


def load_timing(path: Path, speedup: float = 1.0) -> TimingModel:
    """The mock's timing from a profile file (``splitserve worker --mock-profile``)."""
    return TimingModel.from_profile({**timing_fields(load_profile(path)), "speedup": speedup})


# ----------------------------------------------------------------------------------------- engines


async def profile_mock(spec: ProfileSpec, timing: TimingModel | None = None, block_size: int = 16,
                       log: Any = None) -> dict[str, Any]:
    """Profile a mock engine in-process (tests, and to check the pipeline end to end)."""
    from services.worker.engines.mock.engine import MockEngine, MockEngineConfig

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
    from services.worker.engines.vllm.engine import VllmEngineConfig

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


def write_profile(doc: Mapping[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def with_serving_overheads(timing: TimingModel, decode_step_overhead_s: float, prefill_overhead_s: float) -> TimingModel:
    """The engine's timing plus what the serving stack adds, measured on a running graph at low load.

    A profile times the bare engine; served, every decode step also pays the worker, connector and delivery
    (here ~10 ms a step on 2 shared cores), and every remote prefill the route, transfer set-up and first-token
    relay. Added to the model's constant terms (decode base, prefill per-step), the plan's formulas stay as they
    are. Negative measured overheads (noise) count as 0.
    """
    coeffs = list(timing.prefill_coeffs_s) or [0.0]
    coeffs[0] += max(0.0, prefill_overhead_s)
    return replace(timing, decode_base_s=timing.decode_base_s + max(0.0, decode_step_overhead_s),
                   prefill_coeffs_s=tuple(coeffs))
