"""OpenAI response bodies for chat and text completions, whole and as SSE chunks.

The per-token chunk is on the hot path: its constant parts are built once per request as bytes and only the
text is JSON-encoded per chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ResponseShape:
    id: str
    model: str
    is_chat: bool
    created: int
    _head: bytes  # b'data: {"id":...,"choices":[{"index":0,' up to the delta/text field
    _tail: bytes

    @classmethod
    def chat(cls, request_id: str, model: str) -> ResponseShape:
        return cls._make(request_id, model, True, b"chat.completion.chunk", b'"delta":{"content":', b"}")

    @classmethod
    def completion(cls, request_id: str, model: str) -> ResponseShape:
        return cls._make(request_id, model, False, b"text_completion", b'"text":', b"")

    @classmethod
    def _make(cls, request_id: str, model: str, is_chat: bool, obj: bytes, field: bytes, close: bytes):
        created = int(time.time())
        head = (b'data: {"id":' + orjson.dumps(request_id) + b',"object":"' + obj + b'","created":'
                + str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":[{"index":0,' + field)
        tail = close + b',"logprobs":null,"finish_reason":null}]}\n\n'
        return cls(request_id, model, is_chat, created, head, tail)

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk" if self.is_chat else "text_completion",
                                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def first_chunk(self, n: int = 1) -> bytes:
        """Chat streams open with the assistant role, per choice; text completions have no opening chunk."""
        if not self.is_chat:
            return b""
        return b"".join(self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]) for i in range(n))

    def delta_chunk(self, text: str, logprobs: dict[str, Any] | None = None, index: int = 0,
                    usage: dict[str, Any] | None = None) -> bytes:
        if logprobs is None and index == 0:
            if usage is None:
                return self._head + orjson.dumps(text) + self._tail
            # Continuous usage (vLLM's continuous_usage_stats) after the choices, as _chunk orders it: the
            # tail without its closing brace, then the usage.
            return self._head + orjson.dumps(text) + self._tail[:-3] + b',"usage":' + orjson.dumps(usage) + b"}\n\n"
        body = {"delta": {"content": text}} if self.is_chat else {"text": text}
        return self._chunk([{"index": index, **body, "logprobs": logprobs, "finish_reason": None}], usage)

    def final_chunks(self, finish_reasons: list[str], usage: dict[str, Any] | None) -> bytes:
        empty = {"delta": {}} if self.is_chat else {"text": ""}
        out = b"".join(self._chunk([{"index": i, **empty, "logprobs": None, "finish_reason": reason}])
                       for i, reason in enumerate(finish_reasons))
        if usage is not None:
            out += self._chunk([], usage)
        return out + b"data: [DONE]\n\n"

    def parsed_chunk(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None,
                     usage: dict[str, Any] | None = None) -> bytes:
        """A delta from vLLM's parsers (vllm_parsers.py): content, reasoning and tool_calls as it gives them."""
        return self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}], usage)

    def tool_calls_chunk(self, index: int, calls: list[dict[str, Any]]) -> bytes:
        """A choice's tool calls, whole, in one delta (each call with its index among the choice's calls)."""
        deltas = [{"index": k, **call} for k, call in enumerate(calls)]
        return self._chunk([{"index": index, "delta": {"tool_calls": deltas}, "logprobs": None,
                             "finish_reason": None}])

    def full_response(self, choices: list[tuple[Any, ...]], usage: dict[str, Any],
                      prompt_logprobs: list[Any] | None = None) -> bytes:
        """``choices``: (text, finish_reason, logprobs or None[, tool calls or None]) per choice, in index order.
        ``prompt_logprobs``: vLLM's field (echo.py), on each choice of a completion and once for a chat."""
        extra: dict[str, Any] = {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}
        if self.is_chat:
            body = [{"index": i, "message": _message(*choice), "logprobs": choice[2], "finish_reason": choice[1]}
                    for i, choice in enumerate(choices)]
            obj = "chat.completion"
        else:
            body = [{"index": i, "text": choice[0], "logprobs": choice[2], "finish_reason": choice[1], **extra}
                    for i, choice in enumerate(choices)]
            obj = "text_completion"
        top = extra if self.is_chat else {}
        return orjson.dumps({"id": self.id, "object": obj, "created": self.created, "model": self.model,
                             "choices": body, "usage": usage, **top})


def _message(text: str | None, _finish: str, _logprobs: Any, calls: list[dict[str, Any]] | None = None,
             reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None if calls else text}
    if reasoning is not None:  # vLLM's field name (0.32; reasoning_content before)
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message
