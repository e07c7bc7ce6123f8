"""The frontend process: OpenAI-compatible HTTP API over the pipeline to router and workers."""

from __future__ import annotations

import asyncio
import functools
import hmac
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgspec
import orjson
import structlog

from common.errors import ModelError, NoWorkerError, RemoteError, SplitserveError, WorkerLost
from common.transport import new_id
from services.frontend.admission import AdmissionConfig
from services.frontend.admission_gate import AdmissionGate, current_priority
from services.frontend.chat_render import ChatRenderError
from services.frontend.choice_text import ChoiceText
from services.frontend.choices import Choices
from services.frontend.context import (
    min_prompt_tokens,
    offload_tokenization,
    served_context_len,
)
from services.frontend.dashboard import Dashboard
from services.frontend.health import PoolCounts, count_pools, judge_health
from services.frontend.http import HttpConfig, Request, Response, serve
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.loop_lag import watch_loop_lag
from services.frontend.metrics import FrontendMetrics
from services.frontend.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    check_template_kwargs,
    completion_prompt,
    message_chars,
    message_dicts,
    parse_chat,
    parse_completion,
    stop_strings,
)
from services.frontend.pipeline import Pipeline, PipelineConfig
from services.frontend.responses import ResponseShape
from services.frontend.responses_api import ResponsesShape, parse_responses
from services.frontend.served_models import ServedModels
from services.frontend.sampling import engines_of, refusal_for_engines, sampling_params
from services.frontend.tokenizer import ModelTokenizer
from services.frontend.tool_parsers import parser_for_template
from services.frontend.tools import ToolPlan, plan_tools, tool_answer
from services.frontend.vllm_parsers import ParseSession, VllmParsers

log = structlog.get_logger(__name__)

# Method allowed on each route; a path not here is labelled "other" in metrics (never the client's text).
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/responses": "POST", "/v1/models": "GET",
          "/health": "GET",
          "/metrics": "GET", "/dashboard": "GET", "/dashboard/data": "GET"}


_Body = TypeVar("_Body", ChatCompletionRequest, CompletionRequest)


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


class FrontendService:
    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.tokenizer = ModelTokenizer(config.model_dir, config.chat_template)
        self.metrics = FrontendMetrics()
        self.pipeline = Pipeline(config.pipeline, self.metrics)
        self.dashboard = Dashboard(config.model_name, self.pipeline, self.metrics)
        self._served_models = ServedModels(config.model_name, config.model_aliases)
        self.port = 0
        # (monotonic time, serving workers by pool) of the last /health look at the router, and every pool
        # seen serving since start (one gone empty makes /health "degraded").
        self._workers_cache: tuple[float, PoolCounts] = (0.0, PoolCounts())
        self._pools_seen: frozenset[str] = frozenset()
        # Generate requests wait here for a slot, by priority and tenant share (admission.py).
        self._gate = AdmissionGate(config.admission or AdmissionConfig(max_inflight=config.max_inflight_requests))
        self._auth = f"Bearer {config.api_key}".encode() if config.api_key else b""
        self._pool = ThreadPoolExecutor(config.num_tokenizer_threads, thread_name_prefix="tokenize")
        # A token's own text, for logprobs (special tokens kept: the model did sample them).
        decode = self.tokenizer.tokenizer.decode
        self._tool_parser = parser_for_template(self.tokenizer.chat_template_source)
        # vLLM's own parsers when named (imports vLLM); else the frontend's Hermes / Llama 3 JSON reader.
        self._parsers = (VllmParsers(config.model_dir, config.tool_call_parser, config.reasoning_parser)
                         if config.tool_call_parser or config.reasoning_parser else None)
        self._token_text = functools.lru_cache(maxsize=1 << 16)(lambda i: decode([i], skip_special_tokens=False))

    async def run(self, ready: asyncio.Event | None = None) -> None:
        def started(port: int) -> None:
            self.port = port
            if self.config.metrics_port:  # after the HTTP bind: metrics answering means this process serves
                self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
            log.info("frontend_ready", url=f"http://{self.config.http.host}:{port}/v1",
                     model=self.config.model_name,
                     fast_encoder=self.tokenizer.fast_path.reason or "on")
            if ready is not None:
                ready.set()

        loop = asyncio.get_running_loop()
        watchers = [loop.create_task(self.pipeline.watch_workers()),
                    loop.create_task(watch_loop_lag(self.metrics.loop_lag_seconds))]
        try:
            await serve(self.handle, self.config.http, self._on_handler_error, started)
        finally:
            for task in watchers:
                task.cancel()
            self._pool.shutdown(wait=False, cancel_futures=True)
            await self.pipeline.close()

    # ------------------------------------------------------------------------------------------- dispatch
    async def handle(self, req: Request, resp: Response) -> None:
        endpoint = req.path if req.path in ROUTES else "other"
        method = "GET" if req.method == "HEAD" else req.method  # HEAD: GET's answer, headers only
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
                    resp.send(200, self._served_models.listing())
                case ("GET", "/health"):
                    await self._health(resp)
                case ("GET", "/metrics"):
                    resp.send(200, self.metrics.render(), b"text/plain; version=0.0.4")
                case ("GET", "/dashboard"):
                    resp.send(200, self.dashboard.page(), b"text/html; charset=utf-8")
                case ("GET", "/dashboard/data"):
                    resp.send(200, await self.dashboard.data())
                case (_, path) if path in ROUTES:
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
        now = time.monotonic()
        checked_at, counts = self._workers_cache
        if now - checked_at > self.config.worker_list_ttl_s:
            try:
                counts = count_pools(await self.pipeline.list_workers(), self.config.model_name)
            except SplitserveError:
                counts = PoolCounts()
            self._workers_cache = (now, counts)
            self._pools_seen |= counts.pools
        health = judge_health(counts, self._pools_seen)
        resp.send(health.http_status, orjson.dumps({
            "status": health.status, "reasons": health.reasons,
            "num_workers": counts.num_prefill + counts.num_decode, "num_decode_workers": counts.num_decode,
            "num_prefill_workers": counts.num_prefill, "num_draining_workers": counts.num_draining}))

    # ----------------------------------------------------------------------------------------- generation
    def _served(self, body: _Body) -> _Body:
        """The request under the served name (what workers registered and responses carry)."""
        name = self._served_models.canonical(body.model)
        return body if name == body.model else msgspec.structs.replace(body, model=name)

    def _context_len(self) -> int:
        return served_context_len(self.tokenizer.max_model_len, self.pipeline.last_worker_list,
                                  self.config.model_name)

    def _check_prompt_chars(self, num_chars: int, param: str) -> None:
        """Cheap, before any template or tokenizer work: a prompt surely over the context is a fast 400."""
        max_len = self._context_len()
        if min_prompt_tokens(num_chars, self.tokenizer.max_token_chars) >= max_len:
            raise ApiError(400, f"prompt of {num_chars} characters is over this server's context of {max_len} "
                           "tokens", param=param, code="context_length_exceeded")

    async def _off_loop(self, fn, num_chars: int):
        """Runs template/tokenizer work in the pool when it is long enough to hold up other streams."""
        if not offload_tokenization(num_chars, self.tokenizer.offload_min_chars):
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _prompt_limits(self, num_prompt_tokens: int, max_tokens: int | None, param: str = "messages") -> int:
        """Checks the prompt fits the context; returns max_tokens (default: the rest of the context)."""
        max_len = self._context_len()
        if num_prompt_tokens >= max_len:
            raise ApiError(400, f"prompt has {num_prompt_tokens} tokens; this server's context is {max_len} tokens",
                           param=param, code="context_length_exceeded")
        if max_tokens is not None and num_prompt_tokens + max_tokens > max_len:
            raise ApiError(400, f"prompt ({num_prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                           f"the context of {max_len} tokens", param="max_tokens", code="context_length_exceeded")
        return max_tokens if max_tokens is not None else max_len - num_prompt_tokens

    async def _responses(self, req: Request, resp: Response) -> None:
        request, body = parse_responses(req.body)
        await self._chat(req, resp, body, ResponsesShape(new_id("resp"), request))

    async def _chat(self, req: Request, resp: Response, body: ChatCompletionRequest | None = None,
                    shape: ResponseShape | ResponsesShape | None = None) -> None:
        from_chat = body is None
        body = self._served(body or parse_chat(req.body))
        parsers = self._parsers if from_chat else None
        # tool_choice "auto" read by vLLM's parser: the tools go into the prompt, the answer to the parser.
        vllm_tools = bool(parsers and parsers.tool_cls and body.tools and body.tool_choice in (None, "auto"))
        if vllm_tools and not self.config.enable_auto_tool_choice:
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to '
                           "be set", param="tool_choice")
        tools = plan_tools(body.tools, "none" if vllm_tools else body.tool_choice, body.parallel_tool_calls,
                           self._tool_parser)
        parse = None
        if parsers is not None and (vllm_tools or parsers.reasoning_cls is not None):
            try:
                vllm_request = parsers.request(req.body)
            except ValueError as exc:
                raise ApiError(400, f"request not valid for vLLM's parsers: {exc}") from exc
            parse = functools.partial(parsers.session, vllm_request, vllm_tools)
        messages = message_dicts(body.messages)
        num_chars = message_chars(messages)
        self._check_prompt_chars(num_chars, "messages")
        template_tools = tools.template_tools() if tools else None
        template_kwargs = check_template_kwargs(body.chat_template_kwargs)
        if body.add_generation_prompt and body.continue_final_message:
            raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                           param="continue_final_message")
        try:
            prompt = await self._off_loop(lambda: self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt, tools=template_tools,
                template_kwargs=template_kwargs, continue_final_message=body.continue_final_message),
                num_chars)
        except (ChatRenderError, ModelError) as exc:
            raise ApiError(400, f"chat template failed: {exc}", param="messages") from exc
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if requested is not None and requested < 1:
            raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
        max_tokens = self._prompt_limits(len(prompt.token_ids), requested)
        sampling = sampling_params(body, max_tokens, max_tokens, self.tokenizer.eos_token_ids,
                                   self.tokenizer.vocab_size, tools)
        shape = shape or ResponseShape.chat(new_id("chatcmpl"), body.model)
        if self.config.log_prompts:
            log.info("request_prompt", request_id=shape.id, prompt=prompt.text)
        await self._generate(resp, shape, tuple(prompt.token_ids), sampling, stop_strings(body.stop), body,
                             tools if tools is not None and tools.shapes_answer else None, parse)

    async def _completion(self, req: Request, resp: Response) -> None:
        body = self._served(parse_completion(req.body))
        prompt = completion_prompt(body.prompt)
        if isinstance(prompt, str):
            self._check_prompt_chars(len(prompt), "prompt")
            token_ids = await self._off_loop(lambda: self.tokenizer.encode(prompt), len(prompt))
        else:
            if max(prompt) >= self.tokenizer.vocab_size:
                raise ApiError(400, f"token id {max(prompt)} is outside the vocabulary "
                               f"({self.tokenizer.vocab_size})", param="prompt")
            token_ids = prompt
        if not token_ids:
            raise ApiError(400, "prompt encodes to no tokens", param="prompt")
        # OpenAI's completions default is 16 tokens.
        max_tokens = self._prompt_limits(len(token_ids), body.max_tokens if body.max_tokens is not None else 16,
                                         param="prompt")
        sampling = sampling_params(body, max_tokens, max_tokens, self.tokenizer.eos_token_ids,
                                   self.tokenizer.vocab_size)
        shape = ResponseShape.completion(new_id("cmpl"), body.model)
        if self.config.log_prompts:
            log.info("request_prompt", request_id=shape.id, prompt=prompt)
        await self._generate(resp, shape, tuple(token_ids), sampling, stop_strings(body.stop), body)

    async def _generate(self, resp: Response, shape: ResponseShape, token_ids: tuple[int, ...], sampling,
                        stop: tuple[str, ...], body, tools: ToolPlan | None = None, parse=None) -> None:
        await self._check_engines(sampling, "response_format" if tools is None else "tool_choice")
        if priority := current_priority.get():  # admitted by self._gate; the engine schedules by it too
            sampling = msgspec.structs.replace(sampling, priority=priority)
        await self._generate_inner(resp, shape, token_ids, sampling, stop, body, tools, parse)

    async def _check_engines(self, sampling, guided_by: str) -> None:
        """A 400 for what an engine serving this model cannot honour (WorkerInfo.engine; the mock has limits)."""
        workers = self.pipeline.last_worker_list
        if workers is None:
            try:
                workers = await self.pipeline.list_workers()
            except SplitserveError:
                return  # no verdict without the router: the worker refuses (503) what it cannot honour
        refusal = refusal_for_engines(sampling, engines_of(workers, self.config.model_name), guided_by)
        if refusal is not None:
            raise refusal

    async def _generate_inner(self, resp: Response, shape: ResponseShape, token_ids: tuple[int, ...], sampling,
                              stop: tuple[str, ...], body, tools: ToolPlan | None, parse=None) -> None:
        """Stream or collect every choice; ``tools``: a forced tool call (its JSON leaves as tool_calls);
        ``parse``: makes one choice's vLLM parsers (reasoning, tool calls "auto")."""
        sessions: list[ParseSession] | None = [parse() for _ in range(body.n)] if parse else None
        structlog.contextvars.bind_contextvars(request_id=shape.id)
        start_s = time.perf_counter()
        continuous_usage = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        include_usage = bool(body.stream_options and body.stream_options.include_usage
                             or getattr(shape, "always_usage", False))
        choices = [ChoiceText(self.tokenizer.decoder(token_ids), None if sampling.logprobs is None else
                           LogprobsRenderer(self._token_text, shape.is_chat)) for _ in range(body.n)]
        num_output = 0
        num_cached = -1
        last_s = 0.0
        self.metrics.arrival_prompt_tokens.observe(len(token_ids))
        requested = getattr(body, "max_completion_tokens", None) or body.max_tokens
        if requested is not None:
            for _ in range(body.n):  # each choice is a sequence on a decode worker
                self.metrics.arrival_max_tokens.observe(sampling.max_tokens)
        self.metrics.inflight.inc()
        try:
            fanout = Choices(self.pipeline, shape.id, body.model, token_ids, sampling, body.n)
            gen = fanout.__aiter__()
            async with aclosing(gen):
                async for index, out in gen:
                    now_s = time.perf_counter()
                    if num_output == 0:
                        self.metrics.observe_ttft(now_s - start_s)
                    elif out.token_ids:
                        self.metrics.observe_itl((now_s - last_s) / len(out.token_ids))
                    if index == 0 and num_cached < 0:
                        num_cached = out.num_cached_tokens  # the prompt counts once, as choice 0 found it
                    last_s = now_s
                    num_output += len(out.token_ids)
                    choice = choices[index]
                    text, part = choice.feed(out, sampling.stop_token_ids, stop)
                    if body.stream:
                        # Headers wait for the first token, so routing failures still get a real status.
                        if not resp.started:
                            resp.start(200, b"text/event-stream")
                            await resp.write(shape.first_chunk(body.n))
                        if (text or part is not None) and tools is None:
                            so_far = None if not continuous_usage else {
                                "prompt_tokens": len(token_ids), "completion_tokens": num_output,
                                "total_tokens": len(token_ids) + num_output}
                            if sessions is None:
                                await resp.write(shape.delta_chunk(text, part, index, so_far))
                            elif (delta := sessions[index].stream(text, out.token_ids)) or part is not None:
                                await resp.write(shape.parsed_chunk(index, delta or {}, part, so_far))
                    if choice.stopped:
                        fanout.stop(index)
        except NoWorkerError as exc:
            self._send_error(resp, ApiError(503, f"no worker available: {exc}", code="no_worker",
                                            type_="server_error", headers=((b"retry-after", b"1"),)))
            return
        except (WorkerLost, RemoteError) as exc:
            log.warning("request_failed", request_id=shape.id, error=str(exc))
            self._send_error(resp, ApiError(503, f"request failed: {exc}", code="worker_failed",
                                            type_="server_error", headers=((b"retry-after", b"1"),)))
            return
        except (asyncio.CancelledError, ConnectionResetError):
            self.metrics.cancelled.inc()
            raise
        finally:
            self.metrics.inflight.dec()
        num_cached = max(num_cached, 0)
        self.metrics.e2e_seconds.observe(time.perf_counter() - start_s)
        self.metrics.prompt_tokens.inc(len(token_ids))
        self.metrics.cached_tokens.inc(num_cached)
        self.metrics.output_tokens.inc(num_output)
        usage = {"prompt_tokens": len(token_ids), "completion_tokens": num_output,
                 "total_tokens": len(token_ids) + num_output, "prompt_tokens_details": {"cached_tokens": num_cached}}
        results = [c.result() for c in choices]
        if tools is not None:
            results = [_with_tool_calls(tools, *r) for r in results]
        elif sessions is not None:
            results = [_parsed(sessions[i], *r, streamed=bool(body.stream)) for i, r in enumerate(results)]
        if body.stream:
            if not resp.started:
                resp.start(200, b"text/event-stream")
                await resp.write(shape.first_chunk(body.n))
            for index, (text, _, _, calls) in enumerate(results if tools is not None else ()):
                if text:  # held back while it could still turn out to be a tool call
                    await resp.write(shape.delta_chunk(text, None, index))
                if calls:
                    await resp.write(shape.tool_calls_chunk(index, calls))
            resp.end(shape.final_chunks([r[1] for r in results], usage if include_usage else None))
        else:
            resp.send(200, shape.full_response(results, usage))



def _with_tool_calls(tools: ToolPlan, text: str, finish: str, logprobs: dict | None) -> tuple:
    content, finish, calls = tool_answer(tools, text, finish)
    return content, finish, logprobs, calls


def _parsed(session: ParseSession, text: str, finish: str, logprobs: dict | None, streamed: bool) -> tuple:
    """A choice's answer through vLLM's parsers; streamed, its deltas are out already: only the finish."""
    if streamed:
        return text, "tool_calls" if session.called else finish, logprobs, None
    answer = session.whole(text)
    calls = None
    if answer.tool_calls:
        calls = [{"id": c.get("id") or "call_" + new_id("")[-24:], "type": "function", "function": c["function"]}
                 for c in answer.tool_calls]
    return answer.content, "tool_calls" if calls else finish, logprobs, calls, answer.reasoning
