"""The mock engine: the ``Engine`` contract on a real block manager and scheduler, with simulated time.

One asyncio task steps the scheduler: plan, sleep the timing model's step time, pick each sampling sequence's next
token, update, and hand each request its output (to the caller's sink, else its queue). Token ids are a pure function
of the sequence so far and the request's seed (``tokens``), so a disaggregated run (prefill worker makes token 1,
decode worker continues from prompt + token 1) yields the same tokens as an aggregated one.

A hand-off is served as its continuation (``admission.as_continuation``): the prefill's first token joins the
prompt and counts off the budget, and is the one token of the prompt a pulled request computes.

Beside it: ``config``, ``admission`` (request checks), ``tokens``, ``tier``, ``block_manager``, ``scheduler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import structlog

from common.errors import EngineError
from common.protocol import KvTransferParams, TokenLogprobs, WorkerLoad
from common.stream_inbox import StreamInbox
from services.worker.engine import EngineCounters, EngineOutput, EngineRequest, KvEvent, OutputSink
from services.worker.engines.mock.adapters import AdapterNames
from services.worker.engines.mock.admission import as_continuation, seq_spec
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.nixl_transfers import NixlTransfers
from services.worker.engines.mock.sampling import check_supported, next_token
from services.worker.engines.mock.scheduler import KvLoad, Scheduler, SchedulerConfig, SeqOutput, StepPlan
from services.worker.engines.mock.step_notes import StepNotes
from services.worker.engines.mock.tier import Onboard, TierLink
from services.worker.tier_load_log import TierLoadLog
from services.worker.transfer_log import TransferLog

log = structlog.get_logger(__name__)
_TOOK_LAST = object()  # queued once the sink took the last output: generate() returns


@dataclasses.dataclass(slots=True)
class _Live:
    request: EngineRequest
    queue: StreamInbox  # of EngineOutput | BaseException | _TOOK_LAST
    sink: OutputSink | None  # takes outputs until it declines one
    num_cached_tokens: int = 0
    emitted: bool = False
    # Its KV pull failed (--mock-nixl) and the prompt is recomputed here: its first output says so.
    transfer_failed: bool = False


class MockEngine(AdapterNames):
    # Its KV transfers and tier moves are timed by the timing model, not made: the worker exports their bytes
    # apart from wire bytes, and each sample says so (the router learns nothing from them). With config.nixl
    # (--mock-nixl) its P/D transfers are real NIXL READs of real bytes (nixl_transfers.py); tier moves stay made up.
    simulated_transfers = True

    def __init__(self, config: MockEngineConfig) -> None:
        if config.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {config.vocab_size}")
        if config.nixl and config.kv_transfer != "pull":
            raise ValueError("the mock engine moves real bytes (nixl) by READ only: kv_transfer must be pull")
        self.config = config
        self.block_size = config.block_size
        self.num_blocks = config.num_blocks
        self.max_model_len = config.max_model_len
        self._blocks = BlockManager(config.num_blocks, config.block_size, config.hash_seed)
        self._adapter_names = set(config.lora_names)
        self._scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens), self._blocks)
        self._live: dict[str, _Live] = {}
        self._load_handles: dict[str, asyncio.TimerHandle] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._num_prefix_hits = 0
        self.simulated_transfers = not config.nixl
        self._transfers = TransferLog(simulated=self.simulated_transfers)
        self._nixl = None if not config.nixl else NixlTransfers(
            config.engine_id, self._blocks, config.kv_bytes_per_token * config.block_size, self._transfers,
            hold_s=config.nixl_hold_s, xfer_timeout_s=config.nixl_timeout_s)
        self._tier_loads = TierLoadLog(simulated=self.simulated_transfers)
        self._onboards: dict[str, Onboard] = {}  # request id -> its tier lookup, until its load lands
        self._tier = None if config.tier is None else TierLink(
            config.tier, self._blocks, config.kv_bytes_per_token * config.block_size, config.tier_write_through)
        self.kv_bytes_per_token = config.kv_bytes_per_token  # registered: the router prices a KV move with it
        self._notes = StepNotes()  # the prefill rate reported, each request's scheduled and landed times
        # Block-manager events collected each step (offloads there), drained by the publisher (kv_events_pending).
        self._pending_events: list[KvEvent] = []
        self.kv_events_pending = asyncio.Event()
        self.num_onboards = 0
        self.num_onboarded_tokens = 0

    # ------------------------------------------------------------------------------------------ Engine

    async def start(self) -> None:
        if self._closed:
            raise EngineError("mock engine was shut down")
        if self._task is None:
            if self.config.start_s > 0:
                await asyncio.sleep(self.config.start_s)
            if self._nixl is not None:
                await self._nixl.start()
            self._task = asyncio.get_running_loop().create_task(self._step_loop(), name="mock-engine-steps")

    async def generate(self, request: EngineRequest, sink: OutputSink | None = None) -> AsyncIterator[EngineOutput]:
        self._check_serving()
        check_supported(request.request_id, request.sampling)
        request = as_continuation(request)
        spec = seq_spec(request, self.max_model_len, self._blocks, self.config.kv_transfer, self._adapter_names)
        request_id = request.request_id
        if self._tier is not None and request.kv_transfer is None and request_id not in self._live \
                and not request.lora_name:  # adapters.py: no tier lookups for an adapter's prompt
            onboard = await self._tier.onboard_tokens(request.token_ids)
            if onboard.num_tokens:
                spec = dataclasses.replace(spec, num_onboard_tokens=onboard.num_tokens)
                self._onboards[request_id] = onboard
        if request_id in self._live:
            raise EngineError(f"request {request_id!r} is already running")
        live = _Live(request=request, queue=StreamInbox(), sink=sink)
        self._live[request_id] = live
        self._scheduler.add(spec)
        self._wakeup.set()
        try:
            while True:
                item = await live.queue.get()
                if item is _TOOK_LAST:
                    return
                if isinstance(item, BaseException):
                    raise EngineError(f"mock engine failed during request {request_id!r}: {item}") from item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            # The consumer stopped early (cancelled, closed): free the request at once.
            if self._live.get(request_id) is live:
                self._drop(request_id)
            self._onboards.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        live = self._drop(request_id)
        if live is not None:
            live.queue.put_nowait(EngineOutput(request_id, (), "abort", len(live.request.token_ids),
                                               live.num_cached_tokens))
        elif self._nixl is not None:  # a finished prefill (--mock-nixl): no decode comes for its held blocks
            self._nixl.release_request(request_id)

    def load(self) -> WorkerLoad:
        return WorkerLoad(
            num_running=self._scheduler.num_running + self._scheduler.num_loading,
            num_waiting=self._scheduler.num_waiting,
            num_free_blocks=self._blocks.num_free_blocks,
            num_total_blocks=self.num_blocks,
            num_active_blocks=self._scheduler.num_active_blocks(),
            num_waiting_tokens=self._scheduler.num_queued_prefill_tokens(),
            prefill_tokens_per_s=self._notes.prefill_tokens_per_s,
        )

    def settings(self) -> dict[str, str]:
        """Its configuration, under vLLM's names where vLLM has one."""
        c = self.config
        return {"max_model_len": str(c.max_model_len), "max_num_seqs": str(c.max_num_seqs),
                "max_num_batched_tokens": str(c.max_num_batched_tokens), "block_size": str(c.block_size),
                "num_gpu_blocks": str(c.num_blocks)}

    def dead_reason(self) -> str:
        if self._failure is not None:
            return f"mock engine failed: {self._failure!r}"
        task = self._task
        if task is not None and task.done() and not self._closed:
            return "mock engine's step loop ended"
        return ""

    def counters(self) -> EngineCounters:
        """Cumulative counts; ``transfer_seconds`` holds the transfers finished since the previous call."""
        return EngineCounters(
            num_prefix_hits=self._num_prefix_hits,
            num_transfers=self._transfers.num_transfers,
            num_transfer_failures=0 if self._nixl is None else self._nixl.num_failures,
            num_transfer_bytes=self._transfers.num_bytes,
            num_transfer_descriptors=self._transfers.num_descriptors,
            transfer_seconds=self._transfers.drain_seconds(),
            transfer_seconds_total=self._transfers.seconds_total,
            recent_transfers=self._transfers.recent(),
            recent_tier_loads=self._tier_loads.recent(),
        )

    async def shutdown(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail(EngineError("mock engine shut down"))
        if self._tier is not None:
            await self._tier.close()
        if self._nixl is not None:
            await self._nixl.close()

    # ------------------------------------------------------------------------------------------- extras

    def drain_kv_events(self) -> list[KvEvent]:
        """Prefix-cache stores and evictions since the previous call, for the worker to publish."""
        self._collect_events()
        events, self._pending_events = self._pending_events, []
        return events

    def kv_snapshot(self) -> tuple[int, ...]:
        """Hashes of every cached block now; events drained after this call apply on top."""
        return self._blocks.cached_hashes()

    @property
    def num_onboard_rejected(self) -> int:
        """Tier blocks refused on onboarding (not exactly their prefix's KV)."""
        return 0 if self._tier is None else self._tier.num_onboard_rejected

    # ------------------------------------------------------------------------------------------ request

    def _check_serving(self) -> None:
        if self._failure is not None:
            raise EngineError(f"mock engine failed: {self._failure}") from self._failure
        if self._closed or self._task is None:
            raise EngineError("mock engine is not running (call start first)")

    def _drop(self, request_id: str) -> _Live | None:
        live = self._live.pop(request_id, None)
        self._notes.forget(request_id)
        if live is None:
            return None
        handle = self._load_handles.pop(request_id, None)
        if handle is not None:
            handle.cancel()
        self._scheduler.abort(request_id)
        self._wakeup.set()
        return live

    # --------------------------------------------------------------------------------------- KV tier

    def _collect_events(self) -> None:
        """Move the block manager's new events to the publisher's buffer; offload what left the cache."""
        events = self._blocks.drain_events()
        if not events:
            return
        self._pending_events += events
        self.kv_events_pending.set()
        if self._tier is not None:
            self._tier.offload(events)

    # --------------------------------------------------------------------------------------- step loop

    async def _step_loop(self) -> None:
        try:
            while True:
                plan = self._scheduler.schedule() if self._scheduler.has_work() else StepPlan()
                self._notes.scheduled(plan)
                self._collect_events()
                in_step_s = sum(self._start_load(load) for load in plan.loads)
                if not (plan.prefills or plan.decode_seq_ids):
                    # Nothing to compute until a request arrives or leaves, or a transfer lands.
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                step_s = self.config.timing.step_s(
                    plan.num_prefill_tokens, len(plan.decode_seq_ids), plan.num_decode_kv_tokens
                ) + in_step_s
                await asyncio.sleep(step_s)  # sleep(0) at infinite speedup still lets others run
                self._notes.prefill_step(plan.num_prefill_tokens, step_s)
                self._apply(plan)
                self._collect_events()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("mock engine step loop failed")
            self._fail(exc)

    def _apply(self, plan: StepPlan) -> None:
        sampling_ids = [chunk.seq_id for chunk in plan.prefills if chunk.samples]
        sampling_ids += plan.decode_seq_ids
        new_token_ids: dict[str, int] = {}
        new_logprobs: dict[str, TokenLogprobs] = {}
        for seq_id in sampling_ids:
            live = self._live.get(seq_id)
            if live is None or not self._scheduler.has_seq(seq_id):
                continue  # aborted while the step ran
            token_ids = self._scheduler.token_ids(seq_id)
            num_outputs = len(token_ids) - len(live.request.token_ids)
            token_id, logprobs = next_token(token_ids, num_outputs, live.request.sampling, self.config)
            new_token_ids[seq_id] = token_id
            if logprobs is not None:
                new_logprobs[seq_id] = logprobs
        for output in self._scheduler.update(plan, new_token_ids):
            logprobs = new_logprobs.get(output.seq_id)
            self._emit(output, () if logprobs is None else (logprobs,))

    def _emit(self, output: SeqOutput, logprobs: tuple[TokenLogprobs, ...] = ()) -> None:
        live = self._live[output.seq_id]
        first = not live.emitted
        if first:
            live.emitted = True
            live.num_cached_tokens = output.num_cached_tokens
            self._num_prefix_hits += 1 if output.num_cached_tokens > 0 else 0
        kv_transfer = None
        if output.finish_reason is not None:
            del self._live[output.seq_id]
            if live.request.prefill_only:
                kv_transfer = KvTransferParams(
                    remote_engine_id=self.config.engine_id,
                    remote_block_ids=output.block_ids,
                    num_bytes=len(live.request.token_ids) * self.config.kv_bytes_per_token,
                    mode=self.config.kv_transfer,
                )
                if self._nixl is not None:
                    kv_transfer = self._nixl.hold(output.seq_id, live.request.token_ids, output.block_ids,
                                                  kv_transfer)
        transfer_failed, live.transfer_failed = live.transfer_failed, False
        times = self._notes.take(output.seq_id) if first else (0.0, 0.0)
        out = EngineOutput(request_id=output.seq_id, token_ids=(output.token_id,), finish_reason=output.finish_reason,
                           num_prompt_tokens=len(live.request.token_ids), num_cached_tokens=output.num_cached_tokens,
                           kv_transfer=kv_transfer, transfer_failed=transfer_failed, logprobs=logprobs,
                           scheduled_s=times[0], loaded_s=times[1])
        if live.sink is not None:
            if live.sink(out):
                if output.finish_reason is not None:
                    live.queue.put_nowait(_TOOK_LAST)
                return
            live.sink = None  # declined: this output and every later one go through the queue, in order
        live.queue.put_nowait(out)

    # -------------------------------------------------------------------------------------- transfers

    def _start_load(self, load: KvLoad) -> float:
        """Simulate pulling a request's prompt KV: the blocks are held now, usable after the transfer time.
        Returns the seconds the transfer adds to this step: a pull from a prefill worker runs inside it."""
        num_bytes = load.num_tokens * self.config.kv_bytes_per_token
        transfer_s = self.config.timing.transfer_s(num_bytes)
        loop = asyncio.get_running_loop()
        live = self._live.get(load.seq_id)
        kv = live.request.kv_transfer if live is not None else None
        if self._nixl is not None and kv is not None and not load.onboard:
            # Real bytes: a READ on the NIXL thread, off this step (its real seconds are what it costs).
            self._nixl.start_pull(load.seq_id, live.request.token_ids[:-1], load.block_ids, load.num_tokens, kv,
                                  self._pull_done)
            return 0.0
        src_worker_id = kv.remote_engine_id if kv is not None and not load.onboard else ""
        handle = loop.call_later(transfer_s, self._finish_load, load.seq_id, num_bytes, transfer_s, load.onboard,
                                 src_worker_id)
        self._load_handles[load.seq_id] = handle
        return transfer_s if self.config.kv_transfer == "pull" and not load.onboard else 0.0

    def _finish_load(self, seq_id: str, num_bytes: int, transfer_s: float, onboard: bool = False,
                     src_worker_id: str = "") -> None:
        try:
            self._load_handles.pop(seq_id, None)
            if not self._land(seq_id):
                return
            if onboard:  # from a KV tier, counted apart from prefill-worker transfers
                self.num_onboards += 1
                self.num_onboarded_tokens += num_bytes // self.config.kv_bytes_per_token
                # Timed as the worker would see it: the real kvtier lookup, then the simulated move.
                lookup = self._onboards.pop(seq_id, None)
                if lookup is not None:
                    self._tier_loads.record(lookup.tier, num_bytes, lookup.lookup_s + transfer_s)
            else:
                self._transfers.record(transfer_s, num_bytes, src_worker_id=src_worker_id)
            self._wakeup.set()
        except Exception as exc:
            log.exception("mock engine transfer completion failed", request_id=seq_id)
            self._fail(exc)

    def _land(self, seq_id: str) -> bool:
        """A load's KV arrived: the sequence runs (False: it was not loading)."""
        if landed := self._scheduler.finish_load(seq_id):
            self._notes.landed(seq_id)
        return landed

    def _pull_done(self, seq_id: str, ok: bool) -> None:
        """A NIXL pull ended: the KV is here and checked, or the prompt is recomputed here."""
        if ok:
            self._land(seq_id)
        elif self._scheduler.fail_load(seq_id) and (live := self._live.get(seq_id)) is not None:
            live.transfer_failed = True
        self._wakeup.set()

    def _fail(self, exc: BaseException) -> None:
        """Forward ``exc`` to every waiting request; later requests are refused."""
        if self._failure is None and not isinstance(exc, EngineError):
            self._failure = exc
            # A failed transfer callback: the step loop must stop too (it may be mid-step on stale state).
            if self._task is not None and self._task is not asyncio.current_task():
                self._task.cancel()
        for handle in self._load_handles.values():
            handle.cancel()
        self._load_handles.clear()
        lives = list(self._live.values())
        self._live.clear()
        for live in lives:
            live.queue.put_nowait(exc)
