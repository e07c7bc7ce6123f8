"""The frontend's side of a request: route it, run remote prefill if chosen, stream decode, clean up.

``Pipeline.generate`` yields ``Tokens`` slices for one request. Leaving the iterator early (client gone,
stop string) aborts the request on whichever worker holds it, so every block it held is freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

import structlog
from msgspec.structs import replace

from common.continuation import continuation, prefill_finish
from common.errors import NoWorkerError, RemoteError, TransportTimeout, WorkerLost
from common.protocol import (
    Abort,
    ErrorReply,
    Generate,
    GetStats,
    Handoff,
    KvTransferParams,
    ListWorkers,
    Message,
    Route,
    RouteRequest,
    SamplingParams,
    TokenLogprobs,
    Tokens,
    WorkerInfo,
    WorkerList,
    WorkerStats,
)
from common import tracing
from common.local_router import LocalRouter
from common.router_set import RouterSet
from common.tokens_merge import merged
from common.transport import Client, TransportConfig, new_id, open_context
from services.frontend.idle_watch import SILENT, IdleWatch
from services.frontend.metrics import FrontendMetrics
from services.frontend.worker_watch import judge_workers

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    # One router endpoint, or several (replicas), comma-separated: any live one answers.
    router_endpoint: str
    route_timeout_s: float = 5.0
    # With several routers: a router silent this long is skipped and the request goes to the next one.
    router_failover_s: float = 0.5
    # How long a request waits for a worker to (re)appear before a 503: rides out a worker restart.
    no_worker_wait_s: float = 1.0
    # How long a request that lost its worker waits for a capable worker (a restarted or new one) before failing.
    migration_wait_s: float = 30.0
    # Longest wait for the prefill worker's first token (queueing included).
    prefill_timeout_s: float = 120.0
    # Longest silence from a worker inside one request before it counts as lost.
    stream_idle_timeout_s: float = 120.0
    # How often a request may be moved to another worker after its worker was lost.
    migration_limit: int = 3
    # How often the frontend asks the router who is alive; a worker missing from worker_lost_polls answers
    # in a row is lost and its streams migrate (more than one: a restarted router needs a beat to relearn).
    worker_watch_interval_s: float = 0.5
    worker_lost_polls: int = 3
    # When the client gets a remotely prefilled request's first token. "decode": with the decode worker's first
    # output, as vLLM's and SGLang's own P/D routers do: the stream carries no hand-off gap (KV transfer, the
    # decode engine admitting the request: ~85-225 ms between the first two tokens on 2 CPU cores, bench/peers.py),
    # TTFT includes it. A vLLM decode worker's first output is its engine's first step (the forced first token's,
    # sent empty), so the hand-off costs the client one step, as under vLLM's P/D; the mock's is the next token.
    # "prefill": as soon as the prefill worker has it (lower TTFT, that gap inside the stream).
    first_token: Literal["decode", "prefill"] = "decode"
    transport: TransportConfig = TransportConfig()


@dataclass(frozen=True, slots=True)
class _Prefilled:
    first_token_id: int
    kv_transfer: KvTransferParams | None
    finish_reason: str | None
    num_cached_tokens: int
    logprobs: tuple[TokenLogprobs, ...] = ()


class Pipeline:
    def __init__(self, config: PipelineConfig, metrics: FrontendMetrics, router: LocalRouter | None = None) -> None:
        """``router``: a router replica in this process to ask instead of ``config.router_endpoint``'s."""
        self.config = config
        self.metrics = metrics
        self._secure = open_context(config.transport)
        self._ctx = self._secure.ctx
        self._router: RouterSet | LocalRouter = router or RouterSet(
            self._ctx, config.router_endpoint, config.transport, failover_s=config.router_failover_s)
        self._workers: dict[str, Client] = {}
        self._missing_polls: dict[str, int] = {}
        self._instances: dict[str, str] = {}  # endpoint -> the worker instance last listed there (worker_watch.py)
        self.last_worker_list: WorkerList | None = None

    async def close(self) -> None:
        await self._router.close()
        for client in self._workers.values():
            await client.close()
        self._secure.close()

    def _client(self, endpoint: str) -> Client:
        client = self._workers.get(endpoint)
        if client is None:
            client = self._workers[endpoint] = Client(self._ctx, endpoint, self.config.transport.toward("worker"))
            client.start()
        return client

    async def watch_workers(self) -> None:
        """Fail the streams of workers the router no longer lists, or lists restarted, so their requests migrate
        at once (worker_watch.py)."""
        while True:
            await asyncio.sleep(self.config.worker_watch_interval_s)
            try:
                listed = await self.list_workers()
            except (TransportTimeout, RemoteError):
                continue  # router down or restarting: no verdict on workers
            self.last_worker_list = listed
            verdict = judge_workers(list(self._workers), listed, self._missing_polls, self._instances,
                                    self.config.worker_lost_polls)
            self._missing_polls, self._instances = verdict.missing_polls, verdict.instances
            for endpoint, why in verdict.lost:
                log.warning("worker_lost", endpoint=endpoint, reason=why)
                client = self._workers.pop(endpoint)
                client.fail_streams(WorkerLost(why))
                await client.close()

    async def worker_stats(self, timeout_s: float = 0.5) -> list[tuple[WorkerInfo, WorkerStats | None]]:
        """Every registered worker with its stats (None where it did not answer in time)."""
        listed = await self.list_workers()

        async def one(info: WorkerInfo) -> WorkerStats | None:
            try:
                reply = await self._client(info.endpoint).request(GetStats(request_id=new_id("st")), timeout_s)
            except (TransportTimeout, RemoteError):
                return None
            return reply if isinstance(reply, WorkerStats) else None

        stats = await asyncio.gather(*(one(w) for w in listed.workers))
        return list(zip(listed.workers, stats))

    async def ask_worker(self, endpoint: str, msg: Message, timeout_s: float) -> Message:
        """One request to one worker and its reply (RemoteError, TransportTimeout as the transport raises)."""
        return await self._client(endpoint).request(msg, timeout_s)

    async def list_workers(self, timeout_s: float = 1.0) -> WorkerList:
        reply = await self._router.request(ListWorkers(request_id=new_id("ls")), timeout_s)
        assert isinstance(reply, WorkerList)
        return reply

    async def route(self, request_id: str, model: str, token_ids: tuple[int, ...],
                    exclude: tuple[str, ...] = (), exclude_instances: tuple[str, ...] = (),
                    no_worker_wait_s: float | None = None, lora_name: str = "") -> Route:
        with tracing.span("route", phase="route"):
            msg = RouteRequest(request_id=request_id, model=model, token_ids=token_ids, exclude_worker_ids=exclude,
                               exclude_instance_ids=exclude_instances, traceparent=tracing.traceparent(),
                               lora_name=lora_name)
            return await self._route(msg, no_worker_wait_s)

    async def _route(self, msg: RouteRequest, no_worker_wait_s: float | None) -> Route:
        wait_s = self.config.no_worker_wait_s if no_worker_wait_s is None else no_worker_wait_s
        deadline_s = time.monotonic() + wait_s
        while True:
            try:
                reply = await self._router.request(msg, self.config.route_timeout_s)
                assert isinstance(reply, Route)
                return reply
            except RemoteError as exc:
                if exc.code != "no_worker" or time.monotonic() >= deadline_s:
                    raise NoWorkerError(exc.message) from exc
            except TransportTimeout as exc:
                raise NoWorkerError(f"router did not answer: {exc}") from exc
            await asyncio.sleep(0.1)

    async def generate(self, request_id: str, model: str, token_ids: tuple[int, ...], sampling: SamplingParams,
                       route: Route | None = None, on_decode: Callable[[Route], None] | None = None,
                       lora_name: str = "") -> AsyncIterator[Tokens]:
        """Yield output slices; the last has finish_reason. Migrates to another worker if one is lost.

        ``route``: take this route (first attempt) instead of asking the router. ``on_decode``: called with the
        route once the decode worker streams (its prompt KV is then in its prefix cache). ``lora_name``: the
        LoRA adapter of ``model`` to run with, on the prefill and the decode worker alike."""
        generated: list[int] = []
        # Lost worker processes; by instance (a restarted worker keeps its id and must stay eligible), or by
        # id for a worker that does not say its instance.
        excluded: tuple[str, ...] = ()
        excluded_instances: tuple[str, ...] = ()
        num_cached = -1
        for attempt in range(self.config.migration_limit + 1):
            # A migrated request resumes from the prompt plus what was already streamed.
            prompt, remaining = continuation(token_ids, sampling, generated)
            if route is None or attempt > 0:
                # A migrating request waits for a capable worker (its only one may be restarting) up to
                # migration_wait_s.
                route = await self.route(request_id, model, prompt, excluded, excluded_instances,
                                         self.config.migration_wait_s if attempt else None, lora_name)
            try:
                async for out in self._run(request_id, prompt, remaining, route, on_decode, lora_name):
                    generated.extend(out.token_ids)
                    if num_cached < 0:
                        num_cached = out.num_cached_tokens
                    yield replace(out, num_prompt_tokens=len(token_ids), num_cached_tokens=max(num_cached, 0))
                    if out.finish_reason is not None:
                        return
                return
            except WorkerLost as exc:
                if sampling.structured is not None and generated:
                    raise  # a new worker's grammar would start over mid-answer: fail rather than break the JSON
                if route.decode.instance_id:
                    excluded_instances += (route.decode.instance_id,)
                else:
                    excluded += (route.decode.worker_id,)
                self.metrics.migrations.inc()
                log.warning("request_migrating", request_id=request_id, attempt=attempt + 1, reason=str(exc),
                            num_generated=len(generated))
        raise WorkerLost(f"request {request_id} lost its worker {self.config.migration_limit + 1} times")

    async def _run(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams, route: Route,
                   on_decode: Callable[[Route], None] | None = None, lora_name: str = "") -> AsyncIterator[Tokens]:
        handoff = None
        held: Tokens | None = None  # the prefill's first token, sent with the decode worker's first output
        # The prefill worker whose finished prefill holds the prompt's KV for this decode, while the decode is
        # known not to come: it is told (an Abort) so its blocks are freed now, not at the end of their lease.
        unread_prefill: str | None = None
        decode_sent = False
        try:
            # Prompt logprobs come from the engine that computes the prompt, and a decode engine that pulled the
            # KV never did: such a request is prefilled where it decodes.
            if route.prefill is not None and sampling.prompt_logprobs is None:
                self.metrics.prefill_decisions.labels(where="remote").inc()
                prefilled = await self._prefill(request_id, prompt, sampling, route, lora_name)
                if prefilled is not None:
                    unread_prefill = route.prefill.endpoint if prefilled.kv_transfer is not None else None
                    first = Tokens(request_id=request_id, token_ids=(prefilled.first_token_id,),
                                   finish_reason=prefilled.finish_reason,  # type: ignore[arg-type]
                                   num_cached_tokens=prefilled.num_cached_tokens, logprobs=prefilled.logprobs)
                    if prefilled.finish_reason is not None or self.config.first_token == "prefill":
                        yield first
                    else:
                        held = first
                    if prefilled.finish_reason is not None:
                        return  # the whole answer: no decode comes
                    # Without transfer params the decode worker recomputes the prompt: slower, still correct.
                    handoff = Handoff(first_token_id=prefilled.first_token_id, kv_transfer=prefilled.kv_transfer)
            else:
                self.metrics.prefill_decisions.labels(where="local").inc()
            # The same prompt and budget as the prefill's: the hand-off says what was made there (continuation.py).
            msg = Generate(request_id=request_id, token_ids=prompt, sampling=sampling, handoff=handoff,
                           kvtier_remote=route.kvtier_remote, traceparent=tracing.traceparent(),
                           lora_name=lora_name)
            decode_sent = True
            async for out in self._stream(self._client(route.decode.endpoint), msg):
                unread_prefill = None  # the decode has the KV (stopped before its pull: vLLM tells the prefill)
                if out.transfer_failed:
                    self.metrics.transfer_failures.inc()
                if on_decode is not None:
                    on_decode(route)
                    on_decode = None
                if held is not None:
                    # A lost decode worker before this point leaves it unsent: the migration prefills again.
                    yield held
                    held = None
                if out.token_ids or out.finish_reason is not None:
                    yield out  # (an empty one only marks the decode engine's first step: the hand-off done)
        except RemoteError:
            raise  # the decode worker refused or dropped it: it reads nothing
        except BaseException:
            if decode_sent:  # lost or left mid-way: a decode worker may still be reading, its lease frees the KV
                unread_prefill = None
            raise
        finally:
            if unread_prefill is not None:
                self._release_prefill(unread_prefill, request_id)

    def _release_prefill(self, endpoint: str, request_id: str) -> None:
        """Tell a prefill worker its finished prefill's KV will not be read (services/worker/leases.py)."""
        log.info("prefill_kv_released", request_id=request_id, worker_endpoint=endpoint)
        try:
            self._client(endpoint).send_nowait(Abort(request_id=request_id))
        except Exception:  # the worker is gone; its blocks went with it
            pass

    async def _prefill(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams,
                       route: Route, lora_name: str = "") -> _Prefilled | None:
        """Run the prompt on the prefill worker; None means it failed and the decode worker prefills."""
        assert route.prefill is not None
        msg = Generate(request_id=request_id, token_ids=prompt, sampling=sampling, prefill_only=True,
                       traceparent=tracing.traceparent(), lora_name=lora_name)
        try:
            async for out in self._stream(self._client(route.prefill.endpoint), msg,
                                          idle_timeout_s=self.config.prefill_timeout_s):
                if out.finish_reason is None:
                    continue
                if not out.token_ids or out.finish_reason not in ("stop", "length"):
                    return None
                return _Prefilled(first_token_id=out.token_ids[0], kv_transfer=out.kv_transfer,
                                  finish_reason=prefill_finish(out.finish_reason, sampling),
                                  num_cached_tokens=out.num_cached_tokens, logprobs=out.logprobs)
        except (WorkerLost, RemoteError) as exc:
            self.metrics.prefill_fallbacks.inc()
            log.warning("prefill_failed_local_fallback", request_id=request_id, worker=route.prefill.worker_id,
                        reason=str(exc))
        return None

    async def _stream(self, client: Client, msg: Generate, idle_timeout_s: float | None = None) -> AsyncIterator[Tokens]:
        timeout_s = idle_timeout_s or self.config.stream_idle_timeout_s
        # Slices that queue while this stream waits its turn come up as one (tokens_merge.py).
        queue = client.open_stream(msg.request_id, merged)
        finished = False
        watch = IdleWatch(queue, timeout_s)
        loop = asyncio.get_running_loop()
        try:
            client.send_nowait(msg)
            while True:
                # Per token: take a queued reply directly; otherwise wait, one stream-long timer watching.
                if queue.empty():
                    watch.waiting_since = loop.time()
                    reply = await queue.get()
                    watch.waiting_since = None
                else:
                    reply = queue.get_nowait()
                if reply is SILENT:
                    raise WorkerLost(f"{client.endpoint} silent for {timeout_s}s")
                match reply:
                    case Tokens():
                        if reply.finish_reason is not None:
                            finished = True
                        yield reply
                        if finished:
                            return
                    case ErrorReply(code="worker_lost"):
                        raise WorkerLost(reply.message)
                    case ErrorReply():
                        finished = True  # the worker already dropped the request
                        raise RemoteError(reply.code, reply.message)
        finally:
            watch.cancel()
            client.close_stream(msg.request_id)
            if not finished:
                try:
                    client.send_nowait(Abort(request_id=msg.request_id))
                except Exception:  # the worker is gone; its blocks went with it
                    pass

