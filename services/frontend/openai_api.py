"""OpenAI request shapes, their validation, and the error shape every 4xx/5xx uses.

Requests are decoded straight into typed structs (msgspec); a wrong type or value becomes an ``ApiError``
that names the offending field, answered as ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
import orjson

from common.protocol import SamplingParams


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}})


class TextPart(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, frozen=True):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


class _Common(msgspec.Struct, frozen=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    # A signed 64-bit integer: what msgpack carries and every engine's generator takes.
    seed: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    logprobs: Any = None
    user: str | None = None


class ChatCompletionRequest(_Common, frozen=True):
    messages: list[ChatMessage] = []
    max_completion_tokens: int | None = None


class CompletionRequest(_Common, frozen=True):
    # str, token ids, or a one-element list of either (msgspec unions allow one array type: checked below).
    prompt: str | list[Any] = ""
    echo: bool = False


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_PARAM = re.compile(r"at `\$\.?([A-Za-z_0-9.\[\]]*)`")
MAX_STOP_STRINGS = 16


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    if not body:
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        found = _PARAM.search(str(exc))
        param = found.group(1).split("[")[0].split(".")[0] if found else None
        if param is None and "missing required field" in str(exc):
            param = str(exc).split("`")[1] if "`" in str(exc) else None
        raise ApiError(400, f"invalid request: {exc}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's nesting limit (e.g. 100k nested arrays)
        raise ApiError(400, "request body is nested too deeply") from exc


def parse_chat(body: bytes) -> ChatCompletionRequest:
    req = _decode(_chat_decoder, body)
    if not req.messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    return req


def parse_completion(body: bytes) -> CompletionRequest:
    req = _decode(_completion_decoder, body)
    if req.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    return req


def completion_prompt(prompt: str | list[Any]) -> str | list[int]:
    """The one prompt of a completion request: its text or its token ids."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list) and not all(type(t) is int and t >= 0 for t in prompt):
        raise ApiError(400, "prompt must be a string or a list of token ids", param="prompt")
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return prompt


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat template expects them; multi-part content is joined text (no images here)."""
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise ApiError(400, "only text content parts are supported", param="messages")
            content = "".join(p.text or "" for p in content)
        out.append({"role": m.role, "content": content or ""})
    return out


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if len(items) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    return tuple(s for s in items if s)


def sampling_params(req: _Common, max_tokens: int | None, default_max_tokens: int,
                    eos_token_ids: tuple[int, ...]) -> SamplingParams:
    if req.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    if req.logprobs not in (None, False):
        raise ApiError(400, "logprobs are not supported", param="logprobs")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0.0 <= temperature <= 2.0:
        raise ApiError(400, "temperature must be between 0 and 2", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, "top_p must be in (0, 1]", param="top_p")
    return SamplingParams(max_tokens=max_tokens or default_max_tokens, temperature=temperature, top_p=top_p,
                          seed=req.seed, ignore_eos=req.ignore_eos,
                          # ignore_eos means no end token stops generation (vLLM would still honour stop ids).
                          stop_token_ids=() if req.ignore_eos else eos_token_ids)
