"""A request's last two steps: generate every choice through the pipeline, then shape the client's answer.

Tokens stream from the workers (``Choices`` fans the n choices out); each choice's text is cut at stop strings
and rendered with its logprobs (``ChoiceText``), written as SSE chunks when the client streams, and the answer
ends as the OpenAI body (``completion_bodies``, ``responses_as_chat``) with its usage. A worker failure that
survived the pipeline's migrations is a 503 the client may retry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import aclosing

import structlog

from common.errors import NoWorkerError, RemoteError, WorkerLost
from common.protocol import SamplingParams
from common.transport import new_id
from services.frontend.choice_text import ChoiceText, detokenize_options
from services.frontend.choices import Choices
from services.frontend.completion_bodies import ResponseShape
from services.frontend.echo import Echo, prompt_logprobs_json
from services.frontend.http_messages import Response
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.metrics import FrontendMetrics
from services.frontend.openai_api import ApiError, ChatCompletionRequest, CompletionRequest
from services.frontend.pipeline import Pipeline
from services.frontend.responses_as_chat import ResponsesShape
from services.frontend.tokenizer import ModelTokenizer
from services.frontend.tools import ToolPlan, tool_answer
from services.frontend.vllm_parsers import ParseSession

log = structlog.get_logger(__name__)

Shape = ResponseShape | ResponsesShape
Body = ChatCompletionRequest | CompletionRequest


class Answers:
    def __init__(self, pipeline: Pipeline, metrics: FrontendMetrics, tokenizer: ModelTokenizer,
                 token_text: Callable[[int], str]) -> None:
        self.pipeline = pipeline
        self.metrics = metrics
        self.tokenizer = tokenizer
        self._token_text = token_text  # a token's own text, for logprobs

    async def answer(self, resp: Response, shape: Shape, token_ids: tuple[int, ...], sampling: SamplingParams,
                     stop: tuple[str, ...], body: Body, tools: ToolPlan | None = None,
                     parse: Callable[[], ParseSession] | None = None, echo: Echo | None = None,
                     pipeline_id: str | None = None, lora_name: str = "") -> None:
        """Stream or collect every choice, then answer; ``tools``: a forced tool call (its JSON leaves as
        tool_calls); ``parse``: makes one choice's vLLM parsers (reasoning, tool calls "auto"); ``echo``: what
        the answer starts with (echo.py); ``pipeline_id``: the request's id in the graph (default shape.id);
        ``lora_name``: the adapter of ``body.model`` (a served model's name) to run with."""
        sessions: list[ParseSession] | None = [parse() for _ in range(body.n)] if parse else None
        structlog.contextvars.bind_contextvars(request_id=shape.id)
        start_s = time.perf_counter()
        continuous_usage = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        choices = [ChoiceText(self.tokenizer.decoder(token_ids, detokenize_options(body)),
                              None if sampling.logprobs is None else LogprobsRenderer(self._token_text, shape.is_chat),
                              echo) for _ in range(body.n)]
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
            fanout = Choices(self.pipeline, pipeline_id or shape.id, body.model, token_ids, sampling, body.n,
                             lora_name)
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
                        # A chunk for every output that carries tokens, its text empty or not (a token that
                        # decodes to nothing, text held back for a stop string), as vLLM streams them: a client
                        # counting chunks, or timing tokens, sees each one when it is made.
                        if (text or part is not None or out.token_ids) and tools is None:
                            so_far = None if not continuous_usage else {
                                "prompt_tokens": len(token_ids), "completion_tokens": num_output,
                                "total_tokens": len(token_ids) + num_output}
                            if sessions is None:
                                await resp.write(shape.delta_chunk(text, part, index, so_far))
                            elif (delta := sessions[index].stream(
                                    text, out.token_ids, choice.stopped or out.finish_reason is not None)
                                  ) or part is not None:
                                await resp.write(shape.parsed_chunk(index, delta or {}, part, so_far))
                    if choice.stopped:
                        fanout.stop(index)
        except NoWorkerError as exc:
            raise ApiError(503, f"no worker available: {exc}", code="no_worker",
                           type_="server_error", headers=((b"retry-after", b"1"),)) from exc
        except (WorkerLost, RemoteError) as exc:
            log.warning("request_failed", request_id=shape.id, error=str(exc))
            raise ApiError(503, f"request failed: {exc}", code="worker_failed",
                           type_="server_error", headers=((b"retry-after", b"1"),)) from exc
        except (asyncio.CancelledError, ConnectionResetError):
            self.metrics.cancelled.inc()
            raise
        finally:
            self.metrics.inflight.dec()
        self.metrics.e2e_seconds.observe(time.perf_counter() - start_s)
        scored = None if sampling.prompt_logprobs is None else prompt_logprobs_json(
            token_ids, choices[0].prompt_logprobs, self._token_text)
        await self._shape(resp, shape, [c.result() for c in choices], body, len(token_ids), num_output,
                          max(num_cached, 0), tools, sessions, scored)

    async def _shape(self, resp: Response, shape: Shape, results: list[tuple], body: Body, num_prompt: int,
                     num_output: int, num_cached: int, tools: ToolPlan | None,
                     sessions: list[ParseSession] | None, prompt_logprobs: list | None = None) -> None:
        """The answer from every choice's (text, finish_reason, logprobs): tool calls and vLLM's parsers
        applied, as one body or the stream's last chunks; ``prompt_logprobs`` (echo.py) in a whole body."""
        include_usage = bool(body.stream_options and body.stream_options.include_usage
                             or getattr(shape, "always_usage", False))
        self.metrics.prompt_tokens.inc(num_prompt)
        self.metrics.cached_tokens.inc(num_cached)
        self.metrics.output_tokens.inc(num_output)
        usage = {"prompt_tokens": num_prompt, "completion_tokens": num_output,
                 "total_tokens": num_prompt + num_output, "prompt_tokens_details": {"cached_tokens": num_cached}}
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
        elif prompt_logprobs is None:
            resp.send(200, shape.full_response(results, usage))
        else:  # chat and completions only (the Responses API asks none)
            resp.send(200, shape.full_response(results, usage, prompt_logprobs))


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
