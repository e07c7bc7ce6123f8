"""What the frontend keeps per served model (docs/fleet.md): its tokenizer and chat template, its tool-call and
reasoning parsers, and the answerer that detokenizes with them. One frontend serves several models; a request
uses its model's (a LoRA adapter's requests their base model's: an adapter changes weights, not the vocabulary)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.frontend.answer import Answers
from services.frontend.metrics import FrontendMetrics
from services.frontend.pipeline import Pipeline
from services.frontend.tokenizer import ModelTokenizer
from services.frontend.tool_parsers import parser_for_template
from services.frontend.vllm_parsers import VllmParsers


@dataclass(frozen=True)
class FrontendModel:
    """A model after the frontend's first (FrontendConfig.extra_models): its served name, directory, aliases."""

    name: str
    model_dir: Path
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelContext:
    tokenizer: ModelTokenizer
    tool_parser: Any  # the frontend's own Hermes / Llama 3 JSON reader for the template, or None
    parsers: VllmParsers | None  # vLLM's own parsers when named (imports vLLM)
    answers: Answers

    @classmethod
    def build(cls, model_dir: Path, chat_template: str | None, tool_call_parser: str | None,
              reasoning_parser: str | None, pipeline: Pipeline, metrics: FrontendMetrics) -> ModelContext:
        tokenizer = ModelTokenizer(model_dir, chat_template)
        decode = tokenizer.tokenizer.decode
        # A token's own text, for logprobs (special tokens kept: the model did sample them).
        token_text = functools.lru_cache(maxsize=1 << 16)(lambda i: decode([i], skip_special_tokens=False))
        parsers = (VllmParsers(model_dir, tool_call_parser, reasoning_parser)
                   if tool_call_parser or reasoning_parser else None)
        return cls(tokenizer, parser_for_template(tokenizer.chat_template_source), parsers,
                   Answers(pipeline, metrics, tokenizer, token_text))
