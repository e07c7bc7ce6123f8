"""Token logprobs in OpenAI's two shapes: chat's ``{"content": [...]}`` and completions' parallel lists.

Token text is the token decoded alone (special tokens kept), with its UTF-8 bytes for chat; a token that is
part of a multi-byte character decodes to U+FFFD, as in vLLM and OpenAI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.protocol import TokenLogprobs


class LogprobsRenderer:
    """Renders one request's logprobs; remembers the text offset across streamed chunks (completions)."""

    def __init__(self, token_text: Callable[[int], str], is_chat: bool) -> None:
        self._text = token_text
        self._is_chat = is_chat
        self._offset = 0  # characters of token text rendered so far

    def render(self, logprobs: tuple[TokenLogprobs, ...]) -> dict[str, Any]:
        return self._chat(logprobs) if self._is_chat else self._completion(logprobs)

    def merge(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """One response's logprobs from the parts rendered per output slice."""
        if self._is_chat:
            return {"content": [entry for part in parts for entry in part["content"]]}
        keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        return {key: [value for part in parts for value in part[key]] for key in keys}

    def render_prompt(self, token_ids: tuple[int, ...], scored: tuple[TokenLogprobs, ...]) -> dict[str, Any]:
        """Completions' echo: the prompt's tokens first, the first with no logprob (nothing precedes it); each
        other's alternatives as vLLM lists them, its own token first (a later one decoding alike wins)."""
        tokens, values, tops, offsets = [], [], [], []
        for i, token_id in enumerate(token_ids):
            text = self._text(token_id)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            lp = scored[i - 1] if 0 < i <= len(scored) else None
            if lp is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(_finite(lp.logprob))
            top = {text: _finite(lp.logprob)}
            for alt_id, value in lp.top:
                top[self._text(alt_id)] = _finite(value)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def _chat(self, logprobs: tuple[TokenLogprobs, ...]) -> dict[str, Any]:
        content = []
        for lp in logprobs:
            entry = self._chat_entry(lp.token_id, lp.logprob)
            entry["top_logprobs"] = [self._chat_entry(token_id, value) for token_id, value in lp.top]
            content.append(entry)
        return {"content": content}  # vLLM's shape: no "refusal" key

    def _chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode())}

    def _completion(self, logprobs: tuple[TokenLogprobs, ...]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for lp in logprobs:
            text = self._text(lp.token_id)
            tokens.append(text)
            values.append(_finite(lp.logprob))
            # A dict keyed by token text: alternatives that decode alike keep the higher (first) value.
            top: dict[str, float] = {}
            for token_id, value in lp.top:
                top.setdefault(self._text(token_id), _finite(value))
            tops.append(top)
            offsets.append(self._offset)
            self._offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _finite(value: float) -> float:
    # JSON has no -inf or NaN; OpenAI's floor for an impossible token is -9999.0.
    return value if value == value and value > -9999.0 else -9999.0
