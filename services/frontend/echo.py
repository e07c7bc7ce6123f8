"""``echo`` and ``prompt_logprobs``: what vLLM puts before an answer and beside it.

Completions' echo starts the text with the prompt (a token-id prompt decoded) and, with ``logprobs``, its
logprobs with the prompt's (the first token has none: nothing precedes it). Chat's echo starts the content with
the last message's when that message has the answer's role (vLLM's reading: the assistant's, or with
``add_generation_prompt`` off the last message's own). The prompt's logprobs come from the engine that computed
the prompt, on the request's first output slice (SamplingParams.prompt_logprobs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.protocol import TokenLogprobs
from services.frontend.openai_api import ChatCompletionRequest, CompletionRequest


@dataclass(frozen=True, slots=True)
class Echo:
    text: str  # put before the answer's text
    # Completions with logprobs: the prompt's ids, whose logprobs open the answer's; () for none.
    token_ids: tuple[int, ...] = ()


def completion_echo(body: CompletionRequest, prompt: str | list[int], token_ids: tuple[int, ...],
                    decode: Callable[[list[int]], str]) -> Echo | None:
    if not body.echo:
        return None
    text = prompt if isinstance(prompt, str) else decode(list(token_ids))
    return Echo(text, token_ids if body.logprobs is not None else ())


def chat_echo(body: ChatCompletionRequest, messages: list[dict[str, Any]]) -> Echo | None:
    if not body.echo or not messages:
        return None
    last = messages[-1]
    role = "assistant" if body.add_generation_prompt else last["role"]
    content = last.get("content") if last["role"] == role else None
    if isinstance(content, list):
        content = "\n".join(part["text"] for part in content)
    return Echo(content) if content else None


def prompt_logprobs_json(token_ids: tuple[int, ...], scored: tuple[TokenLogprobs, ...],
                         token_text: Callable[[int], str]) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` field: None for the first token, then {token id: {logprob, rank,
    decoded_token}} with the prompt's own token (at its rank) and the alternatives ranked 1..N."""
    out: list[dict[str, Any] | None] = [None] if token_ids else []
    for lp in scored:
        entry = {str(lp.token_id): _entry(lp.logprob, lp.rank, token_text(lp.token_id))}
        for rank, (token_id, value) in enumerate(lp.top, start=1):
            entry.setdefault(str(token_id), _entry(value, rank, token_text(token_id)))
        out.append(entry)
    return out


def _entry(logprob: float, rank: int, text: str) -> dict[str, Any]:
    return {"logprob": logprob if logprob > -9999.0 else -9999.0, "rank": rank, "decoded_token": text}
