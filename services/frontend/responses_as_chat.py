"""``/v1/responses``: the subset of OpenAI's Responses API that maps onto a chat completion.

Text in (a string, or messages with text parts, plus ``instructions`` as the system message), text out,
``text.format`` as structured outputs, streamed as Responses events. What needs server-side state or tools
(``previous_response_id``, ``conversation``, ``tools``, ``store=true``, background runs) is a 400 naming it.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec
import orjson

from services.frontend.openai_api import (
    ApiError,
    ChatCompletionRequest,
    ChatMessage,
    JsonSchema,
    Priority,
    ResponseFormat,
    decode_request,
    refuse_unsupported,
)


class InputPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None


class InputMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputPart]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None


class TextFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str = ""
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: TextFormat | None = None


class ResponsesRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    text: TextOptions | None = None
    # No effect here (see openai_api._NO_EFFECT).
    user: str | None = None
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    parallel_tool_calls: bool | None = None
    # Refused when set (openai_api.UNSUPPORTED and RESPONSES_UNSUPPORTED).
    store: bool | None = None
    service_tier: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    reasoning: Any = None
    previous_response_id: str | None = None
    conversation: Any = None
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    stream_options: Any = None
    # vLLM's: lower runs earlier; read by the admission queue before this parse (admission_gate.py).
    priority: Priority | None = None


RESPONSES_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "tools": ((None, []), "tools are not supported on /v1/responses; use /v1/chat/completions"),
    "tool_choice": ((None, "none"), "tool_choice is not supported on /v1/responses"),
    "reasoning": ((None,), "reasoning is not supported (no reasoning models)"),
    "previous_response_id": ((None,), "previous_response_id is not supported (responses are not stored)"),
    "conversation": ((None,), "conversation is not supported (responses are not stored)"),
    "include": ((None, []), "include is not supported"),
    "truncation": ((None, "disabled"), "only truncation='disabled' is supported"),
    "background": ((None, False), "background responses are not supported"),
    "prompt": ((None,), "prompt templates are not supported"),
    "max_tool_calls": ((None,), "max_tool_calls is not supported (no tools)"),
    "top_logprobs": ((None,), "top_logprobs is not supported on /v1/responses; use /v1/chat/completions"),
    "stream_options": ((None,), "stream_options is not supported on /v1/responses"),
}
_decoder = msgspec.json.Decoder(ResponsesRequest)


def parse_responses(body: bytes) -> tuple[ResponsesRequest, ChatCompletionRequest]:
    """The request and the chat completion it maps onto."""
    req: ResponsesRequest = decode_request(_decoder, body)
    refuse_unsupported(req, RESPONSES_UNSUPPORTED)
    messages = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    if isinstance(req.input, str):
        messages.append(ChatMessage(role="user", content=req.input))
    else:
        for m in req.input:
            text = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content)
            messages.append(ChatMessage(role=m.role, content=text))
    if not messages:
        raise ApiError(400, "input must not be empty", param="input")
    fmt = req.text.format if req.text is not None else None
    response_format = None if fmt is None else ResponseFormat(
        type=fmt.type, json_schema=None if fmt.type != "json_schema" else JsonSchema(
            name=fmt.name, schema=fmt.schema, strict=fmt.strict, description=fmt.description))
    chat = ChatCompletionRequest(model=req.model, messages=messages, max_completion_tokens=req.max_output_tokens,
                                 temperature=req.temperature, top_p=req.top_p, stream=req.stream,
                                 response_format=response_format)
    return req, chat


class ResponsesShape:
    """A Response object, whole or as its stream of events (the interface of completion_bodies.ResponseShape)."""

    is_chat = True
    always_usage = True  # a Response always carries its usage

    def __init__(self, response_id: str, req: ResponsesRequest) -> None:
        self.id = response_id
        self._req = req
        self._item_id = "msg_" + response_id.removeprefix("resp_")
        self._created = int(time.time())
        self._seq = 0
        self._texts: list[str] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    def _response(self, status: str, text: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        fmt = self._req.text.format if self._req.text is not None and self._req.text.format else None
        output = [] if text is None else [self._message(text, "completed" if status == "completed" else
                                                        "incomplete")]
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self._created, "status": status,
            "model": self._req.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self._req.instructions, "max_output_tokens": self._req.max_output_tokens,
            "temperature": self._req.temperature, "top_p": self._req.top_p, "metadata": self._req.metadata or {},
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "store": False,
            "text": {"format": msgspec.to_builtins(fmt) if fmt else {"type": "text"}}, "usage": None,
        }
        if usage is not None:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            # The prefix cache keeps every prompt block it computed: the uncached tokens are the ones written.
            details = {"cached_tokens": cached, "cache_write_tokens": usage["prompt_tokens"] - cached}
            out["usage"] = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                            "total_tokens": usage["total_tokens"], "input_tokens_details": details,
                            "output_tokens_details": {"reasoning_tokens": 0}}
        return out

    def _message(self, text: str, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self._item_id, "status": status, "role": "assistant",
                "content": [_part(text)]}

    def first_chunk(self, n: int = 1) -> bytes:
        item = {"type": "message", "id": self._item_id, "status": "in_progress", "role": "assistant", "content": []}
        return (self._event("response.created", response=self._response("in_progress", None, None))
                + self._event("response.in_progress", response=self._response("in_progress", None, None))
                + self._event("response.output_item.added", output_index=0, item=item)
                + self._event("response.content_part.added", item_id=self._item_id, output_index=0,
                              content_index=0, part=_part("")))

    def delta_chunk(self, text: str, logprobs: dict[str, Any] | None = None, index: int = 0,
                    usage: dict[str, Any] | None = None) -> bytes:
        self._texts.append(text)
        return self._event("response.output_text.delta", item_id=self._item_id, output_index=0, content_index=0,
                           delta=text, logprobs=[])

    def final_chunks(self, finish_reasons: list[str], usage: dict[str, Any] | None) -> bytes:
        text = "".join(self._texts)
        status = "completed" if finish_reasons[0] == "stop" else "incomplete"
        done = self._response(status, text, usage or _NO_USAGE)
        return (self._event("response.output_text.done", item_id=self._item_id, output_index=0, content_index=0,
                            text=text, logprobs=[])
                + self._event("response.content_part.done", item_id=self._item_id, output_index=0,
                              content_index=0, part=_part(text))
                + self._event("response.output_item.done", output_index=0, item=done["output"][0])
                + self._event("response.completed" if status == "completed" else "response.incomplete",
                              response=done))

    def full_response(self, choices: list[tuple[Any, ...]], usage: dict[str, Any]) -> bytes:
        text, finish = choices[0][:2]
        return orjson.dumps(self._response("completed" if finish == "stop" else "incomplete", text, usage))


_NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
             "prompt_tokens_details": {"cached_tokens": 0}}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
