"""A chat request's first two steps: parsed and checked (``parse_chat_request``), then rendered (``render``).

What a chat request asks beyond its sampling fields is settled here before any token exists: which tools go
into the prompt and who reads the answer for calls (the frontend's reader or vLLM's parser), the template's
flags and variables. Everything here is the client's error when wrong (OpenAI-shaped 400).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.errors import ModelError
from services.frontend.chat_render import ChatRenderError
from services.frontend.openai_api import (
    ApiError,
    ChatCompletionRequest,
    check_template_kwargs,
    message_chars,
    message_dicts,
    parse_chat,
    stop_strings,
)
from services.frontend.served_models import ServedModels
from services.frontend.tokenizer import ChatPrompt, ModelTokenizer
from services.frontend.tools import ToolPlan, plan_tools
from services.frontend.vllm_parsers import ParseSession, VllmParsers


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: ChatCompletionRequest
    messages: list[dict[str, Any]]  # as the chat template reads them
    num_chars: int  # of every message's text: bounds the prompt's tokens before rendering (token_budget)
    tools: ToolPlan | None  # the frontend's tool plan (None: no tools, or vLLM's parser reads the answer)
    template_kwargs: dict[str, Any]
    stop: tuple[str, ...]  # stop strings
    # Makes one choice's vLLM parse session (reasoning, tool calls "auto"); None: no vLLM parser reads it.
    parse: Callable[[], ParseSession] | None

    @property
    def max_tokens(self) -> int | None:
        """The client's budget, if it named one (max_completion_tokens over the deprecated max_tokens)."""
        body = self.body
        return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens

    @property
    def answer_tools(self) -> ToolPlan | None:
        """The tool plan when it shapes the answer (a call parsed out of the text), else None."""
        return self.tools if self.tools is not None and self.tools.shapes_answer else None


def parse_chat_request(raw: bytes, body: ChatCompletionRequest | None, models: ServedModels,
                       parsers: VllmParsers | None, tool_parser: str | None,
                       enable_auto_tool_choice: bool) -> ChatRequest:
    """``raw``: the request's bytes (vLLM's parsers read their own request from them); ``body``: the chat request
    another endpoint's maps onto (/v1/responses), else None: parsed from ``raw``; ``parsers``: vLLM's, when
    named and the request came to /v1/chat/completions; ``tool_parser``: the frontend's reader of tool calls
    for this template (tool_parsers.py)."""
    body = models.served(body or parse_chat(raw))
    # tool_choice "auto" read by vLLM's parser: the tools go into the prompt, the answer to the parser.
    vllm_tools = bool(parsers and parsers.tool_cls and body.tools and body.tool_choice in (None, "auto"))
    if vllm_tools and not enable_auto_tool_choice:
        raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to '
                       "be set", param="tool_choice")
    if body.add_generation_prompt and body.continue_final_message:
        raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                       param="continue_final_message")
    tools = plan_tools(body.tools, "none" if vllm_tools else body.tool_choice, body.parallel_tool_calls,
                       tool_parser)
    parse = None
    if parsers is not None and (vllm_tools or parsers.reasoning_cls is not None):
        try:
            vllm_request = parsers.request(raw)
        except ValueError as exc:
            raise ApiError(400, f"request not valid for vLLM's parsers: {exc}") from exc
        parse = functools.partial(parsers.session, vllm_request, vllm_tools)
    messages = message_dicts(body.messages)
    return ChatRequest(body=body, messages=messages, num_chars=message_chars(messages, body.tools), tools=tools,
                       template_kwargs=check_template_kwargs(body.chat_template_kwargs), stop=stop_strings(body.stop),
                       parse=parse)


def render(tokenizer: ModelTokenizer, chat: ChatRequest) -> ChatPrompt:
    """The prompt as vLLM's OpenAI server renders it; a template's refusal is the client's 400."""
    body = chat.body
    try:
        return tokenizer.apply_chat_template(
            chat.messages, add_generation_prompt=body.add_generation_prompt,
            tools=chat.tools.template_tools() if chat.tools else None, template_kwargs=chat.template_kwargs,
            continue_final_message=body.continue_final_message)
    except (ChatRenderError, ModelError) as exc:
        raise ApiError(400, f"chat template failed: {exc}", param="messages") from exc
