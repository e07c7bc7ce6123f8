"""OpenAI request shapes, their validation, and the error shape every 4xx/5xx uses.

Requests are decoded straight into typed structs (msgspec); a wrong type or value becomes an ``ApiError``
that names the offending field, answered as ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
import orjson


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


# A request's priority (vLLM's field; lower runs earlier): a signed 32-bit integer, what any engine takes.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1
Priority = Annotated[int, msgspec.Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]


class TextPart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # An assistant's earlier tool calls, and a tool message's answer to one: rendered by the chat template.
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant's earlier reasoning (vLLM's field; templates with interleaved thinking render it).
    reasoning: str | None = None


class StreamOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    include_usage: bool = False
    # vLLM's extension: usage (so far) on every chunk.
    continuous_usage_stats: bool = False


class JsonSchema(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str = ""
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuredOutputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs`` field (its StructuredOutputsParams): exactly one constraint."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


# Every request field is declared: an unknown one is a 400 naming it (forbid_unknown_fields), and a declared
# one is either honoured or refused with a 400 when set (UNSUPPORTED); a client never gets a 200 that ignored
# what it asked for. The fields in _NO_EFFECT change nothing a client can observe here and are accepted.
class _Common(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
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
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # OpenAI sends token ids as JSON object keys (strings).
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling fields.
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    # vLLM's: keep the k most likely tokens (0 or -1: all), and those at least min_p times the likeliest's.
    top_k: int | None = None
    min_p: float | None = None
    # vLLM's: sampling restricted to these ids; words (tokenized as vLLM does) the output may not contain.
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # vLLM's detokenization options (the frontend detokenizes: services/frontend/choice_text.py).
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # vLLM's: keep the prompt's last (left) or first (right) N tokens; -1: the context less one.
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    # vLLM's: each prompt token's logprob and this many alternatives (-1: the whole vocabulary).
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's: the response id's suffix (the X-Request-Id header wins), default random.
    request_id: str | None = None
    # vLLM's: lower runs earlier; read by the admission queue before this parse (admission_gate.py).
    priority: Priority | None = None
    # Refused when set (see UNSUPPORTED).
    best_of: int | None = None
    # Removed in vLLM 0.32 (which ignores them, unconstrained): refused, naming structured_outputs.
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None


class ChatCompletionRequest(_Common, frozen=True):
    messages: list[ChatMessage] = []
    # vLLM's: extra variables for the chat template (e.g. {"enable_thinking": false}).
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: end the prompt with the assistant's turn opened (default), or continue the last message as is.
    add_generation_prompt: bool = True
    # vLLM's: the answer starts with the last message's content when that message has the answer's role.
    echo: bool = False
    continue_final_message: bool = False
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    # No effect here: accepted (see _NO_EFFECT); store and service_tier only at their defaults.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Function calling (services/frontend/tools.py).
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # Refused when set.
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None
    verbosity: str | None = None


class CompletionRequest(_Common, frozen=True):
    # str, token ids, or a one-element list of either (msgspec unions allow one array type: checked below).
    prompt: str | list[Any] = ""
    # The answer starts with the prompt's text (and, with logprobs, the prompt's logprobs).
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    response_format: ResponseFormat | None = None


# Declared fields refused when set to anything but these values (None: unset), with why.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "best_of other than 1 is not supported"),
    "functions": ((None, []), "functions (function calling) are not supported"),
    "function_call": ((None, "none"), "function_call is not supported"),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "audio": ((None,), "audio output is not supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported (no reasoning models)"),
    "web_search_options": ((None,), "web search is not supported"),
    "verbosity": ((None,), "verbosity is not supported"),
    "store": ((None, False), "store=true is not supported (nothing is stored)"),
    "service_tier": ((None, "auto", "default"), "only the default service_tier is served"),
    **{name: ((None,), f"{name} was removed in vLLM 0.32 (which ignores it); use structured_outputs")
       for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                    "guided_whitespace_pattern")},
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
}
# Accepted with no effect: they change nothing a client can observe from this server.
_NO_EFFECT = ("user", "metadata", "safety_identifier", "prompt_cache_key")


_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_PARAM = re.compile(r"at `\$\.?([A-Za-z_0-9.\[\]]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")
MAX_STOP_STRINGS = 16


def decode_request(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    if not body:
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        found = _PARAM.search(str(exc))
        param = found.group(1).split("[")[0].split(".")[0] if found else None
        unknown = _UNKNOWN.search(str(exc))
        if unknown is not None:
            name = unknown.group(1) if param is None else f"{found.group(1)}.{unknown.group(1)}"  # type: ignore[union-attr]
            raise ApiError(400, f"unsupported field {name!r}: this server does not implement it", param=param
                           or unknown.group(1), code="unsupported_field") from exc
        if param is None and "missing required field" in str(exc):
            param = str(exc).split("`")[1] if "`" in str(exc) else None
        raise ApiError(400, f"invalid request: {exc}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's nesting limit (e.g. 100k nested arrays)
        raise ApiError(400, "request body is nested too deeply") from exc


_Check = tuple[str, tuple[Any, ...], str]  # (field, allowed values, why not)
# UNSUPPORTED's entries a request type declares, by type: found once, not by scanning the type's ~60 field names
# for each entry on every request (~2% of the frontend's CPU on short requests).
_checks_by_type: dict[type, tuple[_Check, ...]] = {}


def _checks(cls: type, table: dict[str, tuple[tuple[Any, ...], str]]) -> tuple[_Check, ...]:
    fields = set(cls.__struct_fields__)  # type: ignore[attr-defined]
    return tuple((name, allowed, why) for name, (allowed, why) in table.items() if name in fields)


def refuse_unsupported(req: Any, table: dict[str, tuple[tuple[Any, ...], str]] | None = None) -> None:
    """A 400 for the first declared field set to a value this server does not serve (``table``: more fields)."""
    if table is None:
        checks = _checks_by_type.get(type(req))
        if checks is None:
            checks = _checks_by_type[type(req)] = _checks(type(req), UNSUPPORTED)
    else:
        checks = _checks(type(req), {**UNSUPPORTED, **table})
    for name, allowed, why in checks:
        value = getattr(req, name)
        if value is None and None in allowed:  # the usual case: not sent
            continue
        if not any(value == ok and type(value) is type(ok) for ok in allowed):
            raise ApiError(400, why, param=name, code="unsupported_field")


def parse_chat(body: bytes) -> ChatCompletionRequest:
    req = decode_request(_chat_decoder, body)
    if not req.messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    refuse_unsupported(req)
    return req


def parse_completion(body: bytes) -> CompletionRequest:
    req = decode_request(_completion_decoder, body)
    refuse_unsupported(req)
    return req


def completion_prompt(prompt: str | list[Any], vocab_size: int) -> str | list[int]:
    """The one prompt of a completion request: its text or its token ids (each in the vocabulary)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) > 1:
            raise ApiError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list) and not all(type(t) is int and t >= 0 for t in prompt):
        raise ApiError(400, "prompt must be a string or a list of token ids", param="prompt")
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt, list) and max(prompt) >= vocab_size:
        raise ApiError(400, f"token id {max(prompt)} is outside the vocabulary ({vocab_size})", param="prompt")
    return prompt


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as OpenAI dicts (chat_render.conversation makes vLLM's conversation of them); text parts only."""
    out = []
    for m in messages:
        content: Any = m.content
        if isinstance(content, list):
            if any(p.type != "text" for p in content):
                raise ApiError(400, "only text content parts are supported", param="messages")
            content = [{"type": "text", "text": p.text or ""} for p in content]
        message: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls:
            message["tool_calls"] = msgspec.to_builtins(m.tool_calls)
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.reasoning is not None:
            message["reasoning"] = m.reasoning
        out.append(message)
    return out


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if len(items) > MAX_STOP_STRINGS:
        raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    return tuple(s for s in items if s)


# chat_template_kwargs may add template variables, never replace what the server renders from the request.
_RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message",
                                     "chat_template", "tokenize"})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The request's chat_template_kwargs, or a 400 naming a variable it may not set."""
    if not kwargs:
        return {}
    if reserved := sorted(_RESERVED_TEMPLATE_VARS & kwargs.keys()):
        raise ApiError(400, f"chat_template_kwargs cannot set {', '.join(reserved)}: they come from the request",
                       param="chat_template_kwargs")
    return kwargs


def message_chars(messages: list[dict[str, Any]], tools: Any = None) -> int:
    """Characters the chat template renders from the request: message text, assistant tool calls and
    reasoning, and the tool schemas (their JSON; templates render them into the prompt). Bounds the prompt's
    tokens before templating and decides the off-loop path: a request of small messages and a megabyte of tool
    schemas is as long as one with a megabyte of text."""
    total = len(msgspec.json.encode(tools)) if tools else 0
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            total += len(content)
        elif content:
            total += sum(len(p["text"]) for p in content)
        if m.get("tool_calls"):
            total += len(msgspec.json.encode(m["tool_calls"]))
        if isinstance(m.get("reasoning"), str):
            total += len(m["reasoning"])
    return total
