"""Text in and out: the model's tokenizer, its chat template and incremental detokenization.

Reads the standard files of a Hugging Face model directory (tokenizer.json, tokenizer_config.json,
config.json, generation_config.json); any directory vLLM can serve works here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from common.errors import ModelError
from services.frontend import chat_render
from services.frontend.context import FAST_OFFLOAD_MIN_CHARS, OFFLOAD_MIN_CHARS
from services.frontend.fast_bpe import FastPath, fast_path


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path} is not valid JSON: {exc}") from exc


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [int(value)]


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    text: str
    token_ids: list[int]


class ModelTokenizer:
    """Tokenizer, chat template and stop ids of one model directory."""

    def __init__(self, model_dir: Path, chat_template: str | None = None) -> None:
        """``chat_template``: a template's text to use instead of the model's own (``--chat-template FILE``)."""
        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise ModelError(f"{model_dir} has no tokenizer.json (a Hugging Face fast-tokenizer file is needed)")
        try:
            self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as exc:
            raise ModelError(f"{model_dir}/tokenizer.json could not be loaded: {exc}") from exc
        # Exact and ~4x cheaper than HF's own encode where the tokenizer's shape allows (fast_bpe.py).
        self.fast_path: FastPath = fast_path(self.tokenizer, _read_json(model_dir / "tokenizer.json"))
        config = _read_json(model_dir / "config.json")
        tok_config = _read_json(model_dir / "tokenizer_config.json")
        gen_config = _read_json(model_dir / "generation_config.json")
        self.max_model_len = int(config.get("max_position_embeddings") or tok_config.get("model_max_length") or 4096)
        eos_ids = _as_list(gen_config.get("eos_token_id")) or _as_list(config.get("eos_token_id"))
        eos_token = tok_config.get("eos_token")
        if isinstance(eos_token, dict):
            eos_token = eos_token.get("content")
        if eos_token and (eos_id := self.tokenizer.token_to_id(eos_token)) is not None and eos_id not in eos_ids:
            eos_ids.append(eos_id)
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        self.vocab_size = int(config.get("vocab_size") or self.tokenizer.get_vocab_size())
        # Most characters of text one token can stand for (special tokens included): bounds a prompt's token
        # count from its length before tokenizing (context.min_prompt_tokens).
        self.max_token_chars = max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)
        template = chat_template if chat_template is not None else _model_template(model_dir, tok_config)
        if template:
            try:
                chat_render.compile_check(template)
            except chat_render.ChatRenderError as exc:
                raise ModelError(f"{model_dir}: {exc}") from exc
        self._template: str | None = template or None
        # transformers passes the tokenizer's special tokens to every template (bos_token, eos_token, ...).
        self._special = chat_render.special_tokens(tok_config)
        # The template's source: its tool-call format picks the parser for tool_choice "auto".
        self.chat_template_source: str = template or ""

    @property
    def offload_min_chars(self) -> int:
        """Prompts of at least this many characters are templated and encoded off the event loop."""
        return OFFLOAD_MIN_CHARS if self.fast_path.encoder is None else FAST_OFFLOAD_MIN_CHARS

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        if self.fast_path.encoder is not None:
            return self.fast_path.encoder.encode(text)
        # The batch "fast" path skips character offsets (unused here): same ids, ~25% less CPU on long prompts.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None,
                            template_kwargs: dict[str, Any] | None = None,
                            continue_final_message: bool = False) -> ChatPrompt:
        """The prompt vLLM's OpenAI server builds from these OpenAI messages (chat_render). ``template_kwargs``:
        the request's chat_template_kwargs, extra template variables over the special tokens (as transformers
        merges them); they cannot replace messages, tools or add_generation_prompt (``check_template_kwargs``).
        Raises chat_render.ChatRenderError for what the template or the messages refuse."""
        if self._template is None:
            raise ModelError("this model has no chat template; use /v1/completions or start with --chat-template")
        text = chat_render.render(self._template, chat_render.conversation(messages, self._template), tools=tools,
                                  add_generation_prompt=add_generation_prompt,
                                  continue_final_message=continue_final_message,
                                  variables={**self._special, **(template_kwargs or {})})
        return ChatPrompt(text=text, token_ids=self.encode(text))

    def decoder(self, prompt_ids: tuple[int, ...] | list[int] = (),
                options: DetokenizeOptions | None = None) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, prompt_ids, options or DetokenizeOptions())


def _model_template(model_dir: Path, tok_config: dict[str, Any]) -> str | None:
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # the named-templates form: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return template


@dataclass(frozen=True, slots=True)
class DetokenizeOptions:
    """vLLM's per-request detokenization fields (SamplingParams of the same names)."""

    skip_special_tokens: bool = True
    # Off (with special tokens shown): two special tokens in a row join without the space between them.
    spaces_between_special_tokens: bool = True
    # A stop string (and a stop token's text) stays at the end of the answer.
    include_stop_str_in_output: bool = False


class IncrementalDetokenizer:
    """Turns a stream of token ids into text, never emitting half a UTF-8 character, as vLLM's
    FastIncrementalDetokenizer does.

    Stop strings are found across chunk boundaries: text that could still be the start of a stop string is
    held back until it is decided (unless the stop string is to be kept: then nothing needs holding).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: tuple[int, ...] | list[int] = (),
                 options: DetokenizeOptions = DetokenizeOptions()) -> None:
        self._tokenizer = tokenizer
        self.options = options
        # Primed with the prompt, as vLLM's detokenizer is: the first output token decodes in the prompt's
        # context (a word's leading space, bytes of a character the prompt began).
        self._stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=options.skip_special_tokens)
        self._pending = ""  # decoded but held back: could be the start of a stop string
        # Added tokens by id (their text), when spaces between special tokens are to be dropped.
        self._added: dict[int, str] = {}
        if not options.skip_special_tokens and not options.spaces_between_special_tokens:
            self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._last_special = False

    def feed(self, token_ids: tuple[int, ...] | list[int], stop: tuple[str, ...] = ()) -> StepText:
        tok = self._tokenizer
        parts = [self._pending]
        for token_id in token_ids:
            try:
                piece = self._stream.step(tok, token_id)
            except Exception as exc:
                if not str(exc).startswith(_INVALID_PREFIX):
                    raise
                # The tokenizer's output went non-monotonic (invalid UTF-8 joins): start a fresh stream at this
                # token, as vLLM recovers.
                self._stream = DecodeStream(skip_special_tokens=self.options.skip_special_tokens)
                piece = self._stream.step(tok, token_id)
            if self._added:
                special = self._added.get(token_id)
                if special is not None and self._last_special:
                    piece = special  # its text without the space the decoder puts between added tokens
                self._last_special = special is not None
            if piece:
                parts.append(piece)
        text = "".join(parts)
        if not stop:
            self._pending = ""
            return StepText(text=text, stopped=False)
        keep = self.options.include_stop_str_in_output
        # The stop string that completes first, ties in list order (vLLM's check_stop_strings).
        found = [(at + len(s), i, at) for i, s in enumerate(stop) if (at := text.find(s)) >= 0]
        if found:
            end, _, at = min(found)
            self._pending = ""
            return StepText(text=text[:end] if keep else text[:at], stopped=True)
        if keep:
            self._pending = ""
            return StepText(text=text, stopped=False)
        hold = _longest_stop_prefix_suffix(text, stop)
        self._pending = text[len(text) - hold:] if hold else ""
        return StepText(text=text[: len(text) - hold], stopped=False)

    def flush(self) -> str:
        """Text held back for a stop string that never completed."""
        text, self._pending = self._pending, ""
        return text


_INVALID_PREFIX = "Invalid prefix encountered"  # tokenizers' DecodeStream error (vLLM matches the same text)


@dataclass(frozen=True, slots=True)
class StepText:
    text: str
    # A stop string was found: text ends just before it and generation must end.
    stopped: bool


def _longest_stop_prefix_suffix(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
