"""vLLM's own tool-call and reasoning parsers (``--tool-call-parser NAME``, ``--reasoning-parser NAME``).

The classes come from the installed vLLM's registries (``ToolParserManager``, ``ReasoningParserManager``), not
copies, and run as vLLM's chat server runs them: reasoning first (its parser splits ``reasoning`` from the
content until the model ends it), then the tool-call parser over the content, on every streamed step with the
previous/current/delta texts and token ids, or once over the whole answer. Each choice gets its own parser
instances (they keep state between steps). vLLM is imported only when one of the options is set (~10 s).

The request the parsers see is vLLM's own ``ChatCompletionRequest`` built from the client's JSON body, so a
parser's ``adjust_request`` and its reading of ``tools`` / ``tool_choice`` are vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


class ParserError(ValueError):
    """An unknown parser name, or vLLM not installed (the frontend refuses to start)."""


@dataclass(frozen=True)
class ParsedAnswer:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]] | None


class VllmParsers:
    """The parser classes named on the command line and vLLM's tokenizer of the model (the parsers read its
    vocabulary); ``session`` makes one choice's parsers for one request."""

    def __init__(self, model_dir: Path, tool_parser: str | None, reasoning_parser: str | None) -> None:
        try:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
            from vllm.reasoning import ReasoningParserManager
            from vllm.tokenizers import get_tokenizer
            from vllm.tool_parsers import ToolParserManager
        except ImportError as exc:
            raise ParserError(f"--tool-call-parser / --reasoning-parser need vLLM installed: {exc}") from exc
        self._request_type = ChatCompletionRequest
        try:
            self.tool_cls = ToolParserManager.get_tool_parser(tool_parser) if tool_parser else None
            self.reasoning_cls = (ReasoningParserManager.get_reasoning_parser(reasoning_parser)
                                  if reasoning_parser else None)
        except KeyError as exc:
            raise ParserError(f"{exc}; vLLM has tool parsers {sorted(ToolParserManager.list_registered())} and "
                              f"reasoning parsers {sorted(ReasoningParserManager.list_registered())}") from exc
        self.tokenizer = get_tokenizer(str(model_dir))
        if self.reasoning_cls is not None:
            try:  # at start, not on the first request: e.g. a parser needing <think> tokens this vocabulary lacks
                self.reasoning_cls(self.tokenizer)
            except RuntimeError as exc:
                raise ParserError(f"--reasoning-parser {reasoning_parser}: {exc}") from exc

    def request(self, body: bytes) -> Any:
        """vLLM's request model of the client's body (what its parsers read tools and tool_choice from)."""
        return self._request_type.model_validate(orjson.loads(body))

    def session(self, request: Any, use_tools: bool) -> ParseSession:
        tool = self.tool_cls(self.tokenizer, request.tools) if use_tools and self.tool_cls else None
        if tool is not None:
            request = tool.adjust_request(request)
        reasoning = self.reasoning_cls(self.tokenizer) if self.reasoning_cls else None
        return ParseSession(request, tool, reasoning)


@dataclass
class ParseSession:
    request: Any
    tool: Any | None
    reasoning: Any | None
    _text: str = ""
    _token_ids: list[int] = field(default_factory=list)
    _reasoning_ended: bool = False
    # Content (after reasoning) seen by the tool parser so far: its previous/current texts and ids.
    _content: str = ""
    _content_ids: list[int] = field(default_factory=list)
    called: bool = False

    def stream(self, delta_text: str, delta_ids: list[int] | tuple[int, ...], finished: bool = False
               ) -> dict[str, Any] | None:
        """One step's delta as vLLM's streaming chat sends it ({"content"}, {"reasoning"}, {"tool_calls"}), or
        None when the parsers hold this step back. ``finished``: the choice's last step, where vLLM flushes the
        arguments its tool parser parsed but held back."""
        out = self._step(delta_text, delta_ids)
        calls = out.get("tool_calls") if out else None
        if finished and calls and self.tool is not None and "function" in calls[-1]:
            # vLLM's Parser.finalize_generation: the last call of the last delta gets the rest of its arguments.
            function = calls[-1]["function"]
            function["arguments"] = function.get("arguments", "") + self.tool.get_remaining_unstreamed_args()
        return out

    def _step(self, delta_text: str, delta_ids: list[int] | tuple[int, ...]) -> dict[str, Any] | None:
        previous, previous_ids = self._text, self._token_ids
        self._text = previous + delta_text
        self._token_ids = previous_ids + list(delta_ids)
        content_delta, content_ids = delta_text, list(delta_ids)
        out: dict[str, Any] = {}
        if self.reasoning is not None and not self._reasoning_ended:
            delta = self.reasoning.extract_reasoning_streaming(previous, self._text, delta_text, previous_ids,
                                                               self._token_ids, list(delta_ids))
            if self.reasoning.is_reasoning_end(self._token_ids):
                self._reasoning_ended = True
            if delta is None:
                return None
            if delta.reasoning:
                out["reasoning"] = delta.reasoning
            content_delta = delta.content or ""
            if not self._reasoning_ended or not content_delta:
                if delta.content:
                    out["content"] = delta.content
                return out or None
            content_ids = self.reasoning.extract_content_ids(list(delta_ids))
        if self.tool is None:
            if content_delta:
                out["content"] = content_delta
            return out or None
        prev_content, prev_ids = self._content, self._content_ids
        self._content += content_delta
        self._content_ids = prev_ids + content_ids
        delta = self.tool.extract_tool_calls_streaming(prev_content, self._content, content_delta, prev_ids,
                                                       self._content_ids, content_ids, self.request)
        if delta is not None:
            dumped = delta.model_dump(exclude_none=True)
            if dumped.get("tool_calls"):
                self.called = True
            out.update({k: v for k, v in dumped.items() if k in ("content", "tool_calls", "reasoning")})
        return out or None

    def whole(self, text: str) -> ParsedAnswer:
        """A whole answer split as vLLM's non-streaming chat splits it."""
        reasoning, content = None, text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract_reasoning(text, self.request)
        if self.tool is None or content is None:
            return ParsedAnswer(content, reasoning, None)
        info = self.tool.extract_tool_calls(content, self.request)
        if not info.tools_called:
            return ParsedAnswer(content, reasoning, None)
        self.called = True
        calls = [c.model_dump(exclude_none=True) for c in info.tool_calls]
        return ParsedAnswer(info.content, reasoning, calls)
