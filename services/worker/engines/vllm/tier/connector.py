"""kvtier for vLLM: a v1 KV connector (loaded through ``kv_connector_module_path``) that onboards prompt
prefixes from kvtier and writes computed prompt blocks through to it.

Scheduler side (vLLM's engine-core process):
* ``get_num_new_matched_tokens``: our chained hashes (``common.hashing``, the worker's seed) of the prompt's
  loadable full blocks past vLLM's local hit; a probe ``TierLookup(with_data=False)`` with a short timeout
  asks kvtier for the leading run it holds. Any failure is 0 tokens: a recompute, never an error.
* ``update_state_after_alloc`` turns the hit into a load plan (our hash -> vLLM block id), passed to the
  workers in ``TierConnectorMetadata``. The load is synchronous: vLLM runs it before the step's forward.
* ``build_connector_meta`` also asks for a write-through once a request's prefill is done: the full prompt
  blocks it computed itself (``tier_plan``).

Worker side (the model-runner process): ``register_kv_caches`` fixes the packing (``kv_layout``);
``start_load_kv`` puts the planned blocks into the KV cache and checks every block's xxh3 checksum and size
(``tier_loader``). Blocks that do not arrive intact are reported by
``get_block_ids_with_load_errors``; with ``kv_load_failure_policy="recompute"`` vLLM recomputes from the first
of them, so a bad or missing block costs time, never a wrong token. ``wait_for_save`` packs the blocks to write
through (one copy, while they are still this request's) and queues them for a background thread.

Data path. Load: ``transfer="nixl"`` (default) READs blocks straight from kvtier's registered pool into the KV
cache with NIXL (``tier_nixl``): host blocks from their slots, disk blocks from bounce slots kvtier reads them
into; the lookup answers slots and checksums, verified after the READ. ``"inline"``, or no NIXL on either side
(kvtier registers its pool seconds after it starts), moves every block as bytes in ZeroMQ messages. Save:
always bytes in ZeroMQ messages (``TierStore``).

KV cache on a GPU: packing and unpacking run on the device (``KvLayout``), and ``TierMover`` (``mover.py``)
copies the packed blocks device <-> pinned host memory on a side stream: a save's device -> host copy is waited
for by the connector's ``kvtier-d2h`` thread, not by the engine step; a load's host -> device copy is ordered
before the forward on the GPU. Loads on a GPU are inline bytes (the NIXL READ path registers the KV cache as
host memory and checks xxh3 in place, which VRAM would need a host bounce for). On CPU the mover hands tensors
through as they are: the same code, no copy.

Settings come from ``kv_connector_extra_config``: ``kvtier_endpoint``, ``hash_seed``, ``worker_id``,
``write_through`` (default true), ``transfer`` ("nixl" | "inline"), ``lookup_timeout_s`` (probe, default 0.1),
``fetch_timeout_s`` (default 5), ``max_pending_mib`` (write-through queue, default 64), ``curve_dir`` (the
worker's CURVE key directory: a path, never key material; ``settings.py``). Per request,
``kv_transfer_params["kvtier_remote"]`` (the router's pick, ``common.kvtier.sources``) names another host's tier
for the blocks right after the own tier's run; those are loaded from it (``tier_remotes``) and written through.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from common.errors import EngineError
from common.hashing import adapter_seed, block_hashes
from common.kvtier.sources import load_sources
from services.worker.engines.vllm.tier.layout import KvLayout
from services.worker.engines.vllm.tier.mover import HostCopy, TierMover
from services.worker.engines.vllm.tier.stats import TierLoadStats, TierPromMetrics
from services.worker.engines.vllm.tier.plan import (
    BlockPlan,
    RequestState,
    load_plan,
    max_loadable_blocks,
    save_plan,
    split_plan,
)
from services.worker.engines.vllm.tier.remotes import RemoteTiers
from services.worker.engines.vllm.tier.loader import TierLoader
from services.worker.engines.vllm.tier.nixl import NixlOnboarder
from services.worker.engines.vllm.tier.settings import tier_client_config
from common.kvtier.sync_client import SyncTierClient

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = structlog.get_logger(__name__)

CONNECTOR_NAME = "SplitserveTierConnector"
MODULE_PATH = "services.worker.engines.vllm.tier.connector"


@dataclass
class TierConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockPlan] = field(default_factory=list)
    saves: list[BlockPlan] = field(default_factory=list)


class SplitserveTierConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.block_size = int(vllm_config.cache_config.block_size)
        self.hash_seed = int(extra.get("hash_seed", 0))
        self.write_through = bool(extra.get("write_through", True))
        self.fetch_timeout_s = float(extra.get("fetch_timeout_s", 5.0))
        self.transfer = str(extra.get("transfer", "nixl"))
        self.worker_id = str(extra.get("worker_id", "vllm"))
        self.client = SyncTierClient(tier_client_config(extra))
        # Bytes of write-through blocks waiting for kvtier, at most (the oldest are dropped beyond).
        self.max_pending_bytes = int(extra.get("max_pending_mib", 64)) * 1024 * 1024
        # Other hosts' tiers a request's ``kv_transfer_params["kvtier_remote"]`` names (the router's choice).
        self.remotes = RemoteTiers(self.client.config, self.transfer == "nixl", self.fetch_timeout_s)
        # Scheduler side.
        self._requests: dict[str, tuple[Request, RequestState]] = {}
        # Worker side.
        self._num_blocks = int(kv_cache_config.num_blocks)
        self._layout: KvLayout | None = None
        self._nixl: NixlOnboarder | None = None
        self._loader: TierLoader | None = None
        self._mover: TierMover | None = None
        # Saves whose device -> host copy is still running (GPU): (copy, block hashes); None stops the thread.
        self._d2h: queue.SimpleQueue[tuple[HostCopy, list[int]] | None] = queue.SimpleQueue()
        self._d2h_thread: threading.Thread | None = None
        self._load_errors: set[int] = set()
        self._failed_reqs: set[str] = set()  # loads that failed this step: their computed blocks are suspect
        self.num_loaded_blocks = 0
        self.num_load_errors = 0
        self._load_stats = TierLoadStats()  # loads not yet handed to vLLM's stats

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a future miss

    # ====================================================================================== scheduler side

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return 0, False  # NixlConnector pulls this prompt from its prefill worker
        state = self._state(request)
        state.num_computed_tokens, state.num_tier_blocks = num_computed_tokens, 0
        first = num_computed_tokens // self.block_size
        end = max_loadable_blocks(request.num_prompt_tokens, self.block_size)
        if first >= end:
            return 0, False
        began = time.perf_counter()
        state.num_tier_blocks = self.client.probe(state.prompt_hashes[first:end])
        # The own tier first; a tier on another host (named by the router) for the blocks right after its run.
        remote = str(params.get("kvtier_remote") or "")
        state.num_remote_blocks, state.remote = 0, ""
        if remote and remote != self.client.config.endpoint and first + state.num_tier_blocks < end:
            probed = self.remotes.probe(remote, state.prompt_hashes[first + state.num_tier_blocks:end])
            sources = load_sources(state.num_tier_blocks, remote, probed, end - first)
            state.num_remote_blocks, state.remote = sources.num_remote, sources.remote
        if state.num_tier_blocks or state.num_remote_blocks:
            log.info("kvtier_hit", worker_id=self.worker_id, req_id=request.request_id,
                     num_blocks=state.num_tier_blocks, num_remote_blocks=state.num_remote_blocks,
                     remote=state.remote, first_block=first, probe_ms=round((time.perf_counter() - began) * 1e3, 2))
        return (state.num_tier_blocks + state.num_remote_blocks) * self.block_size, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        entry = self._requests.get(request.request_id)
        if entry is None or num_external_tokens <= 0:
            return
        state, block_ids = entry[1], blocks.get_block_ids()[0]
        try:
            plan = load_plan(request.request_id, state.prompt_hashes, state.num_computed_tokens,
                             num_external_tokens, block_ids, self.block_size)
            state.loads = split_plan(plan, state.num_tier_blocks, state.remote) if plan is not None else []
        except ValueError:  # vLLM counts these tokens as loaded now: a plan of no hashes fails every block
            log.exception("kvtier_plan_failed", req_id=request.request_id)
            first = state.num_computed_tokens // self.block_size
            state.loads = [BlockPlan(request.request_id, (), tuple(block_ids[first:first + num_external_tokens //
                                                                             self.block_size]))]

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = TierConnectorMetadata()
        for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            entry = self._requests.get(req_id)
            if entry is None:
                continue
            request, state = entry
            meta.loads.extend(state.loads)
            state.loads = []
            if state.first_computed_block is None:
                # Not yet advanced by this step: the local + tier hit it starts from.
                state.first_computed_block = request.num_computed_tokens // self.block_size
                if state.num_remote_blocks:  # from another host's tier: kept in the own one too (next time local)
                    state.first_computed_block = min(state.first_computed_block, state.num_computed_tokens //
                                                     self.block_size + state.num_tier_blocks)
            if (self.write_through and not state.saved
                    and state.prefill_done_after(request.num_computed_tokens, num_scheduled)):
                state.saved = True
                assert self._kv_cache_manager is not None
                plan = save_plan(req_id, state.prompt_hashes, state.first_computed_block,
                                 self._kv_cache_manager.get_block_ids(req_id)[0])
                if plan is not None:
                    meta.saves.append(plan)
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._requests.pop(request.request_id, None)
        return False, None

    def _state(self, request: Request) -> RequestState:
        entry = self._requests.get(request.request_id)
        if entry is None:
            prompt = list(request.prompt_token_ids or ())
            # An adapter's KV is its own: stored and looked up under its seed, never the base model's blocks.
            seed = adapter_seed(self.hash_seed, request.lora_request.lora_name if request.lora_request else "")
            state = RequestState(block_hashes(prompt, self.block_size, seed), len(prompt))
            self._requests[request.request_id] = (request, state)
            return state
        state = entry[1]
        state.loads, state.first_computed_block = [], None  # asked again: a new schedule (e.g. after preemption)
        return state

    # ========================================================================================= worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        try:
            self._layout = KvLayout.from_kv_caches(kv_caches, self._num_blocks)
        except EngineError as exc:  # a cache layout we cannot pack (an attention backend's strides): no tier
            log.warning("kvtier_layout_unsupported", error=str(exc),
                        shapes=[tuple(t.shape) for t in kv_caches.values()])
            return
        # The block size is known now: cap the write-through queue in bytes (no socket is open yet).
        self.client = SyncTierClient(dataclasses.replace(
            self.client.config, max_pending_blocks=max(16, self.max_pending_bytes // self._layout.block_bytes)))
        self._mover = TierMover(self._layout.device)
        if self._mover.on_cuda:  # NIXL onboarding registers host memory and checks it in place: inline bytes
            self.transfer = "inline"
            self.remotes.use_nixl = False
        if self.transfer == "nixl":
            try:
                self._nixl = NixlOnboarder(self._layout, self.worker_id)
            except Exception as exc:  # registration refused: inline bytes only
                log.warning("kvtier_nixl_unavailable", error=repr(exc))
        self._loader = TierLoader(self._layout, self.client, self._nixl, self.fetch_timeout_s, self._mover)
        # Learn kvtier's pool now (add_remote_agent + a descriptor list per slot: milliseconds), not in the first
        # load; if kvtier is not up yet, the first load asks again.
        self._loader.nixl_ready(stats_timeout_s=0.2)
        log.info("kvtier_connector_ready", shapes=[tuple(t.shape) for t in kv_caches.values()],
                 num_blocks=self._num_blocks, block_bytes=self._layout.block_bytes, device=str(self._layout.device),
                 endpoint=self.client.config.endpoint,
                 write_through=self.write_through, transfer="nixl" if self._nixl and self._nixl.usable else "inline")

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierConnectorMetadata)
        self._failed_reqs.clear()
        for plan in meta.loads:
            self._load(plan)

    def _load(self, plan: BlockPlan) -> None:
        began = time.perf_counter()
        loader = self._loader
        if loader is None or self._layout is None:  # no layout (kvtier_layout_unsupported): vLLM recomputes
            self._load_errors.update(plan.block_ids)
            self._failed_reqs.add(plan.req_id)
            return
        if plan.source:
            loader = self.remotes.loader(plan.source, self._layout, self.worker_id)
            if loader is None:  # past the remote tiers kept: recomputed
                self._load_errors.update(plan.block_ids)
                self._failed_reqs.add(plan.req_id)
                return
        loader.phases = {}
        via = "nixl" if loader.nixl_ready() else "inline"
        try:
            num_ok = loader.load_nixl(plan) if via == "nixl" else loader.load_inline(plan)
        except Exception:  # a bug of ours must cost a recompute, not the engine
            log.exception("kvtier_load_failed", req_id=plan.req_id)
            num_ok = 0
        self.num_loaded_blocks += num_ok
        missing = plan.block_ids[num_ok:]
        if missing:  # vLLM recomputes from the first of these on
            self._load_errors.update(missing)
            self._failed_reqs.add(plan.req_id)
            self.num_load_errors += len(missing)
            log.warning("kvtier_load_incomplete", req_id=plan.req_id, num_planned=len(plan.block_ids),
                        num_loaded=num_ok)
        block_bytes = self._layout.block_bytes if self._layout else 0
        seconds = time.perf_counter() - began
        # A load that got nothing timed a miss, not the tier's speed; one from another host's kvtier timed the
        # network too (the router prices those by its links).
        if num_ok and not plan.source:
            self._load_stats.record(loader.last_tier, num_ok * block_bytes, seconds)
        log.info("kvtier_loaded", worker_id=self.worker_id, req_id=plan.req_id, via=via, num_blocks=num_ok,
                 source=plan.source or "own",
                 num_bytes=num_ok * block_bytes, ms=round(seconds * 1e3, 3),
                 gbps=round(num_ok * block_bytes / max(seconds, 1e-9) / 1e9, 3), **loader.phases)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete in start_load_kv, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata,
                      **kwargs: Any) -> None:
        return  # whole blocks are packed once the forward is done (wait_for_save)

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata() or self._layout is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierConnectorMetadata)
        for plan in meta.saves:
            if plan.req_id in self._failed_reqs:
                continue  # computed on top of blocks that did not load: vLLM recomputes them, we skip them
            began = time.perf_counter()
            try:
                assert self._mover is not None
                copy = self._mover.to_host(self._layout.pack(plan.block_ids))
                if copy.done():  # CPU: host memory already
                    self._store(copy, list(plan.block_hashes))
                else:  # GPU: the kvtier-d2h thread waits for the side stream's copy, then sends
                    self._start_d2h_thread()
                    self._d2h.put((copy, list(plan.block_hashes)))
            except Exception:  # a save is best effort: never the engine's failure
                log.exception("kvtier_save_failed", req_id=plan.req_id)
                continue
            # The engine step waits for the pack (the blocks may be reused right after); not the D2H copy or send.
            log.info("kvtier_write_through", worker_id=self.worker_id, req_id=plan.req_id,
                     num_blocks=len(plan.block_ids), ms=round((time.perf_counter() - began) * 1e3, 3))

    def _store(self, copy: HostCopy, block_hashes: list[int]) -> None:
        packed = copy.wait().numpy()
        self.client.store([(h, packed[i].tobytes()) for i, h in enumerate(block_hashes)])

    def _start_d2h_thread(self) -> None:
        if self._d2h_thread is None:
            self._d2h_thread = threading.Thread(target=self._d2h_loop, name="kvtier-d2h", daemon=True)
            self._d2h_thread.start()

    def _d2h_loop(self) -> None:
        while (item := self._d2h.get()) is not None:
            try:
                self._store(*item)
            except Exception:  # best effort, as every save
                log.exception("kvtier_save_failed")

    def get_kv_connector_stats(self) -> TierLoadStats | None:
        return self._load_stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TierLoadStats:
        return TierLoadStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> TierPromMetrics:
        # Never None: beside NIXL, vLLM's MultiConnector asserts that a child reporting stats has metrics.
        return TierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._d2h_thread is not None:  # the copies under way are sent before the client closes
            self._d2h.put(None)
            self._d2h_thread.join(timeout=5.0)
        if self._nixl is not None:
            self._nixl.close()
        self.remotes.close()
        self.client.close()


def register_with_vllm() -> None:
    """Our name in vLLM's connector factory, in every process that imports this module (the worker, where vLLM's
    stat loggers rebuild a MultiConnector's children by name, and the engine core, which imports it by path)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.register_connector(CONNECTOR_NAME, MODULE_PATH, SplitserveTierConnector.__name__)
    except ValueError:
        pass  # registered already (this module imported twice, or a re-import in tests)


register_with_vllm()
