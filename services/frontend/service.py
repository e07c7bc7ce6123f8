"""The frontend process: OpenAI-compatible HTTP API over the pipeline to router and workers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import orjson
import structlog

from common.errors import SplitserveError
from common.local_router import LocalRouter
from common.transport import new_id
from services.frontend import utility_api
from services.frontend.admission import AdmissionConfig
from services.frontend.admission_gate import AdmissionGate, current_priority
from services.frontend.answer import Answers
from services.frontend.adapters_api import change_adapters, parse_adapter_request
from services.frontend.chat_request import parse_chat_request, render
from services.frontend.completion_bodies import ResponseShape
from services.frontend.context import offload_tokenization, served_context_len, truncate_prompt
from services.frontend.dashboard import Dashboard
from services.frontend.echo import Echo, chat_echo, completion_echo
from services.frontend.health import PoolCounts, count_pools, judge_health
from services.frontend.hosted import Hosted, serve_beside, start_hosted, stop_hosted
from services.frontend.http import HttpConfig, Request, Response, serve
from services.frontend.loop_lag import watch_loop_lag
from services.frontend.metrics import FrontendMetrics
from services.frontend.openai_api import (
    ApiError,
    ChatCompletionRequest,
    completion_prompt,
    parse_chat,
    parse_completion,
    stop_strings,
)
from services.frontend.pipeline import Pipeline, PipelineConfig
from services.frontend.request_ids import response_ids
from services.frontend.responses_as_chat import ResponsesShape, parse_responses
from services.frontend.sampling import engines_of, guided_field, refusal_for_engines, sampling_params
from services.frontend.model_context import FrontendModel, ModelContext
from services.frontend.served_models import ServedModel, ServedModels, Target
from services.frontend.token_budget import COMPLETION_DEFAULT_MAX_TOKENS, check_prompt_chars, max_tokens_for
from services.frontend.tools import ToolPlan

log = structlog.get_logger(__name__)
ROUTER_RETRY_S = 5.0  # how long /v1/models trusts that a router which did not answer is still away

# Method allowed on each route; a path not here is labelled "other" in metrics (never the client's text).
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/responses": "POST", "/v1/models": "GET",
          "/v1/load_lora_adapter": "POST", "/v1/unload_lora_adapter": "POST",
          "/health": "GET", "/tokenize": "POST", "/detokenize": "POST", "/version": "GET", "/ping": "GET",
          "/metrics": "GET", "/dashboard": "GET", "/dashboard/data": "GET"}


@dataclass(frozen=True)
class FrontendConfig:
    model_name: str  # what responses carry and workers register
    model_dir: Path
    pipeline: PipelineConfig
    http: HttpConfig = field(default_factory=HttpConfig)
    # Seconds a /health answer from the router is reused.
    worker_list_ttl_s: float = 0.5
    # Clients must send `Authorization: Bearer <api_key>` on every path but open_paths when set.
    api_key: str = ""
    open_paths: tuple[str, ...] = ("/health", "/metrics", "/dashboard")
    # Log each request's prompt text (off: prompts and secrets never reach the log).
    log_prompts: bool = False
    # More names requests may use for model_name (vLLM's extra --served-model-name values); /v1/models lists all.
    model_aliases: tuple[str, ...] = ()
    # Threads that template and tokenize long prompts off the event loop.
    num_tokenizer_threads: int = 2
    # This process's own Prometheus port (0: /metrics on the HTTP port only).
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Generate requests in flight beyond which new ones get 503 + Retry-After (bounded memory under overload);
    # ``admission`` (the queue, priorities and tenant shares) replaces it when set.
    max_inflight_requests: int = 4096
    admission: AdmissionConfig | None = None
    # vLLM's OpenAI-server options: a chat template's text over the model's own; vLLM's tool-call and
    # reasoning parsers by name (tool_stream.py); "auto" tool choice only with the flag when a parser is named.
    chat_template: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # The models served after the first (model_name, model_dir, model_aliases), each with its own workers
    # (docs/fleet.md): `frontend --model DIR --model DIR2 --served-model-name a --served-model-name b`.
    extra_models: tuple[FrontendModel, ...] = ()


class FrontendService:
    def __init__(self, config: FrontendConfig, router: LocalRouter | None = None,
                 hosted: tuple[Hosted, ...] = ()) -> None:
        """``router``: a router replica in this process to route through; ``hosted``: services run in this loop
        before it serves (that replica's ``run``), each setting its event once ready."""
        self.config = config
        self.metrics = FrontendMetrics()
        self.pipeline = Pipeline(config.pipeline, self.metrics, router)
        self._hosted = hosted
        self.dashboard = Dashboard(config.model_name, self.pipeline, self.metrics)
        models = (FrontendModel(config.model_name, config.model_dir, config.model_aliases), *config.extra_models)
        self._served_models = ServedModels(tuple(ServedModel(m.name, m.aliases) for m in models))
        self._models = {m.name: ModelContext.build(m.model_dir, config.chat_template, config.tool_call_parser,
                                                   config.reasoning_parser, self.pipeline, self.metrics)
                        for m in models}
        self.tokenizer = self._models[config.model_name].tokenizer  # the first model's
        self.port = 0
        # (monotonic time, serving workers by pool) of the last /health look at the router, and every pool
        # seen serving since start (one gone empty makes /health "degraded").
        self._workers_cache: tuple[float, PoolCounts] = (0.0, PoolCounts())
        self._pools_seen: frozenset[str] = frozenset()
        self._router_silent_at = -ROUTER_RETRY_S  # monotonic s the router last failed to list workers
        # Generate requests wait here for a slot, by priority and tenant share (admission.py).
        self._gate = AdmissionGate(config.admission or AdmissionConfig(max_inflight=config.max_inflight_requests))
        self._auth = f"Bearer {config.api_key}".encode() if config.api_key else b""
        self._pool = ThreadPoolExecutor(config.num_tokenizer_threads, thread_name_prefix="tokenize")

    async def run(self, ready: asyncio.Event | None = None) -> None:
        def started(port: int) -> None:
            self.port = port
            if self.config.metrics_port:  # after the HTTP bind: metrics answering means this process serves
                self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
            log.info("frontend_ready", url=f"http://{self.config.http.host}:{port}/v1",
                     models=list(self._models),
                     fast_encoder=self.tokenizer.fast_path.reason or "on")
            if ready is not None:
                ready.set()

        loop = asyncio.get_running_loop()
        watchers = [loop.create_task(self.pipeline.watch_workers()),
                    loop.create_task(watch_loop_lag(self.metrics.loop_lag_seconds))]
        hosted: list[asyncio.Task[None]] = []
        try:
            hosted = await start_hosted(self._hosted)
            await serve_beside(serve(self.handle, self.config.http, self._on_handler_error, started), hosted)
        finally:
            for task in watchers:
                task.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            await self.pipeline.close()
            await stop_hosted(hosted)

    # ------------------------------------------------------------------------------------------- dispatch
    async def handle(self, req: Request, resp: Response) -> None:
        endpoint = req.path if req.path in ROUTES else "other"
        method = "GET" if req.method == "HEAD" else req.method  # HEAD: GET's answer, headers only
        if client_id := req.headers.get("x-request-id"):  # vLLM's (with --enable-request-id-headers): echoed
            resp.headers = ((b"x-request-id", client_id.encode("latin-1")),)
        try:
            if not self._authorized(req):
                raise ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key")
            match (method, req.path):
                case ("POST", "/v1/chat/completions"):
                    async with self._gate.admitted(req.path, req.body, req.headers):
                        await self._chat(req, resp)
                case ("POST", "/v1/completions"):
                    async with self._gate.admitted(req.path, req.body, req.headers):
                        await self._completion(req, resp)
                case ("POST", "/v1/responses"):
                    async with self._gate.admitted(req.path, req.body, req.headers):
                        await self._responses(req, resp)
                case ("GET", "/v1/models"):
                    resp.send(200, self._served_models.listing(await self._worker_list()))
                case ("POST", "/v1/load_lora_adapter" | "/v1/unload_lora_adapter"):
                    await self._change_adapters(req, resp, load=req.path == "/v1/load_lora_adapter")
                case ("GET", "/health"):
                    await self._health(resp)
                case ("GET" | "POST", "/ping"):
                    resp.send((await self._judge_health())[0].http_status, b"", b"text/plain")
                case ("POST", "/tokenize"):
                    request = utility_api.parse_tokenize(req.body)
                    model = self._served_models.canonical(request.model or self.config.model_name)
                    resp.send(200, await self._off_loop(functools.partial(
                        utility_api.tokenize, request, self._models[model].tokenizer, self._context_len(model)),
                        len(req.body)))
                case ("POST", "/detokenize"):
                    request = utility_api.parse_detokenize(req.body)
                    model = self._served_models.canonical(request.model or self.config.model_name)
                    resp.send(200, utility_api.detokenize(request, self._models[model].tokenizer))
                case ("GET", "/version"):
                    resp.send(200, utility_api.version())
                case ("GET", "/metrics"):
                    resp.send(200, self.metrics.render(), b"text/plain; version=0.0.4")
                case ("GET", "/dashboard"):
                    resp.send(200, self.dashboard.page(), b"text/html; charset=utf-8")
                case ("GET", "/dashboard/data"):
                    resp.send(200, await self.dashboard.data())
                case (_, path) if path in ROUTES and path != "/ping":
                    raise ApiError(405, f"method {req.method} not allowed on {req.path}",
                                   headers=((b"allow", ROUTES[path].encode()),))
                case _:
                    raise ApiError(404, f"no route {req.method} {req.path}", code="not_found")
        except ApiError as exc:
            self._send_error(resp, exc)
        self.metrics.requests.labels(endpoint=endpoint, status=str(resp.status)).inc()

    def _send_error(self, resp: Response, exc: ApiError) -> None:
        if resp.done or resp.disconnected:
            return
        if resp.started:
            # Headers (and maybe chunks) are out, and every response we stream is server-sent events: a second
            # HTTP response would land inside this one's body. Report it in-band, as OpenAI does, end the body,
            # and close the connection after it.
            resp.keep_alive = False
            resp.end(b"data: " + exc.body() + b"\n\ndata: [DONE]\n\n")
            return
        resp.send(exc.status, exc.body(), headers=exc.headers)

    def _authorized(self, req: Request) -> bool:
        if not self._auth or req.path in self.config.open_paths:
            return True
        return hmac.compare_digest(req.headers.get("authorization", "").encode("latin-1"), self._auth)

    def _on_handler_error(self, resp: Response, exc: BaseException) -> None:
        # One line: a traceback (and any locals a renderer adds: headers, prompt) only at debug.
        log.error("handler_crashed", error_type=type(exc).__name__, error=str(exc)[:200])
        log.debug("handler_crashed_traceback", exc_info=exc)
        self._send_error(resp, ApiError(500, "internal error", type_="server_error"))

    async def _health(self, resp: Response) -> None:
        health, counts = await self._judge_health()
        resp.send(health.http_status, orjson.dumps({
            "status": health.status, "reasons": health.reasons,
            "num_workers": counts.num_prefill + counts.num_decode, "num_decode_workers": counts.num_decode,
            "num_prefill_workers": counts.num_prefill, "num_draining_workers": counts.num_draining}))

    async def _judge_health(self):
        now = time.monotonic()
        checked_at, counts = self._workers_cache
        if now - checked_at > self.config.worker_list_ttl_s:
            try:
                counts = count_pools(await self.pipeline.list_workers(), tuple(self._models))
            except SplitserveError:
                counts = PoolCounts()
            self._workers_cache = (now, counts)
            self._pools_seen |= counts.pools
        return judge_health(counts, self._pools_seen), counts

    # ----------------------------------------------------------------------------------------- generation
    async def _change_adapters(self, req: Request, resp: Response, load: bool) -> None:
        adapter = parse_adapter_request(req.body, load)
        try:
            workers = await self.pipeline.list_workers()
        except SplitserveError as exc:
            raise ApiError(503, f"the router did not answer: {exc}", code="no_worker", type_="server_error") from None
        text = await change_adapters(self.pipeline.ask_worker, workers, self._served_models, adapter, load)
        log.info("adapter_loaded" if load else "adapter_unloaded", lora_name=adapter.lora_name)
        with contextlib.suppress(SplitserveError):  # the workers beat the router with it before they answered us
            self.pipeline.last_worker_list = await self.pipeline.list_workers()
        resp.send(200, text.encode(), b"text/plain; charset=utf-8")

    async def _worker_list(self):
        """The router's last worker list (fetched when there is none yet); None without a router: /v1/models
        then lists the models without their adapters, and for ROUTER_RETRY_S answers without asking again (a
        client polling it must not wait a router timeout each time)."""
        if self.pipeline.last_worker_list is None:
            if time.monotonic() - self._router_silent_at < ROUTER_RETRY_S:
                return None
            try:
                return await self.pipeline.list_workers()
            except SplitserveError:
                self._router_silent_at = time.monotonic()
                return None
        return self.pipeline.last_worker_list

    async def _served(self, body):
        """The request under its served model's name (what workers registered), what it names (an adapter
        too), and that model's tokenizer and parsers."""
        try:
            target = self._served_models.target(body.model, self.pipeline.last_worker_list)
        except ApiError as miss:
            # Not a name here by the last list: an adapter loaded since may be (one fresh look, on a miss only).
            try:
                self.pipeline.last_worker_list = await self.pipeline.list_workers()
            except SplitserveError:
                raise miss from None
            target = self._served_models.target(body.model, self.pipeline.last_worker_list)
        body = body if target.model == body.model else msgspec.structs.replace(body, model=target.model)
        return body, target, self._models[target.model]

    def _context_len(self, model: str | None = None) -> int:
        """How long a sequence of ``model`` (default: the first) may be: its config's, capped by its workers."""
        model = model or self.config.model_name
        return served_context_len(self._models[model].tokenizer.max_model_len, self.pipeline.last_worker_list,
                                  model)

    async def _off_loop(self, fn, num_chars: int):
        """Runs template/tokenizer work in the pool when it is long enough to hold up other streams."""
        if not offload_tokenization(num_chars, self.tokenizer.offload_min_chars):
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _responses(self, req: Request, resp: Response) -> None:
        request, body = parse_responses(req.body)
        await self._chat(req, resp, body, ResponsesShape(new_id("resp"), request))

    async def _chat(self, req: Request, resp: Response, body: ChatCompletionRequest | None = None,
                    shape: ResponseShape | ResponsesShape | None = None) -> None:
        """parse, render, admit, generate, shape. ``body``, ``shape``: /v1/responses' request as a chat one."""
        served, target, ctx = await self._served(body or parse_chat(req.body))
        tokenizer, context_len = ctx.tokenizer, self._context_len(target.model)
        chat = parse_chat_request(req.body, served, self._served_models, ctx.parsers if body is None else None,
                                  ctx.tool_parser, self.config.enable_auto_tool_choice)
        if chat.body.truncate_prompt_tokens is None:  # a prompt to be truncated may be any length
            check_prompt_chars(chat.num_chars, tokenizer.max_token_chars, context_len, "messages")
        prompt = await self._off_loop(functools.partial(render, tokenizer, chat), chat.num_chars)
        token_ids = self._truncated(prompt.token_ids, chat.body)
        max_tokens = max_tokens_for(chat.max_tokens, len(token_ids), context_len)
        sampling = sampling_params(chat.body, max_tokens, tokenizer.eos_token_ids, tokenizer.vocab_size, chat.tools,
                                   tokenizer.encode)
        public_id, pipeline_id = response_ids("chatcmpl", req.headers, chat.body)
        shape = shape or ResponseShape.chat(public_id, target.name)
        if self.config.log_prompts:
            log.info("request_prompt", request_id=shape.id, prompt=prompt.text)
        await self._generate(resp, shape, tuple(token_ids), sampling, chat.stop, chat.body, chat.answer_tools,
                             chat.parse, chat_echo(chat.body, chat.messages), pipeline_id,
                             guided_field(chat.body, chat.tools), target)

    async def _completion(self, req: Request, resp: Response) -> None:
        """parse, tokenize, admit, generate, shape."""
        body, target, ctx = await self._served(parse_completion(req.body))
        tokenizer, context_len = ctx.tokenizer, self._context_len(target.model)
        prompt = completion_prompt(body.prompt, tokenizer.vocab_size)
        if isinstance(prompt, str) and body.truncate_prompt_tokens is None:  # one to be truncated: any length
            check_prompt_chars(len(prompt), tokenizer.max_token_chars, context_len, "prompt")
        if isinstance(prompt, str):
            token_ids = await self._off_loop(lambda: tokenizer.encode(prompt), len(prompt))
        else:
            token_ids = prompt
        if not token_ids:
            raise ApiError(400, "prompt encodes to no tokens", param="prompt")
        token_ids = self._truncated(token_ids, body)
        max_tokens = max_tokens_for(body.max_tokens, len(token_ids), context_len,
                                    COMPLETION_DEFAULT_MAX_TOKENS, param="prompt")
        sampling = sampling_params(body, max_tokens, tokenizer.eos_token_ids, tokenizer.vocab_size,
                                   encode=tokenizer.encode)
        public_id, pipeline_id = response_ids("cmpl", req.headers, body)
        shape = ResponseShape.completion(public_id, target.name)
        if self.config.log_prompts:
            log.info("request_prompt", request_id=shape.id, prompt=prompt)
        echo = completion_echo(body, prompt, tuple(token_ids), tokenizer.tokenizer.decode)
        await self._generate(resp, shape, tuple(token_ids), sampling, stop_strings(body.stop), body, None, None, echo,
                             pipeline_id, guided_field(body, None), target)

    def _truncated(self, token_ids, body):
        """vLLM's truncate_prompt_tokens applied to the tokenized prompt (context.truncate_prompt)."""
        try:
            return truncate_prompt(token_ids, body.truncate_prompt_tokens, body.truncation_side,
                                   self._context_len(body.model))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="truncate_prompt_tokens") from exc

    async def _generate(self, resp: Response, shape: ResponseShape, token_ids: tuple[int, ...], sampling,
                        stop: tuple[str, ...], body, tools: ToolPlan | None = None, parse=None,
                        echo: Echo | None = None, pipeline_id: str | None = None,
                        guided_by: str = "response_format", target: Target | None = None) -> None:
        """``echo``: what the answer starts with; ``pipeline_id``: the graph's id when not the response's;
        ``guided_by``: the field that asked for guided decoding (named if an engine cannot); ``target``: the
        model and adapter the request names (default: body.model's, no adapter)."""
        target = target or Target(body.model, "", body.model)
        await self._check_engines(sampling, guided_by, target.model)
        if priority := current_priority.get():  # admitted by self._gate; the engine schedules by it too
            sampling = msgspec.structs.replace(sampling, priority=priority)
        await self._models[target.model].answers.answer(resp, shape, token_ids, sampling, stop, body, tools, parse,
                                                        echo, pipeline_id, target.lora_name)

    async def _check_engines(self, sampling, guided_by: str, model: str) -> None:
        """A 400 for what an engine serving this model cannot honour (WorkerInfo.engine; the mock has limits)."""
        workers = self.pipeline.last_worker_list
        if workers is None:
            try:
                workers = await self.pipeline.list_workers()
            except SplitserveError:
                return  # no verdict without the router: the worker refuses (503) what it cannot honour
        refusal = refusal_for_engines(sampling, engines_of(workers, model), guided_by)
        if refusal is not None:
            raise refusal
