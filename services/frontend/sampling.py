"""An OpenAI request's sampling fields, checked, as the ``SamplingParams`` every worker of the request gets.

Ranges follow OpenAI (penalties in [-2, 2], logit_bias in [-100, 100], top_logprobs up to 20) and vLLM
(repetition_penalty > 0, min_tokens <= max_tokens). What an engine kind cannot honour is refused here, by
the field's name, before any worker sees the request (``refusal_for_engines``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from common.protocol import SamplingParams, StructuredOutput
from services.frontend.choices import MAX_CHOICES
from services.frontend.openai_api import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    StructuredOutputs,
)
from services.frontend.tools import ToolPlan

MAX_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows

MAX_BAD_WORDS = 128  # token sequences after tokenization (vLLM's VLLM_MAX_NUM_BAD_WORDS default)

# What each engine kind cannot honour, by OpenAI field name. vLLM honours every field this server accepts.
_ENGINE_UNSUPPORTED: dict[str, tuple[str, ...]] = {
    "mock": ("presence_penalty", "frequency_penalty", "repetition_penalty", "response_format",
             "allowed_token_ids", "bad_words", "prompt_logprobs"),
}


def sampling_params(req: ChatCompletionRequest | CompletionRequest, max_tokens: int,
                    eos_token_ids: tuple[int, ...], vocab_size: int, tools: ToolPlan | None = None,
                    encode: Callable[[str], list[int]] | None = None) -> SamplingParams:
    """``max_tokens``: the request's budget as token_budget.max_tokens_for decided it. ``encode``: the model's
    tokenizer (no special tokens), for bad_words; without it they are refused."""
    _check(1 <= req.n <= MAX_CHOICES, f"n must be between 1 and {MAX_CHOICES}", "n")
    temperature = 1.0 if req.temperature is None else req.temperature
    _check(0.0 <= temperature <= 2.0, "temperature must be between 0 and 2", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    _check(0.0 < top_p <= 1.0, "top_p must be in (0, 1]", "top_p")
    top_k = req.top_k or 0  # vLLM: 0 and -1 both mean every token
    _check(top_k == -1 or top_k >= 0, "top_k must be -1, 0 (all tokens) or at least 1", "top_k")
    min_p = req.min_p or 0.0
    _check(0.0 <= min_p <= 1.0, "min_p must be in [0, 1]", "min_p")
    presence = req.presence_penalty or 0.0
    _check(-2.0 <= presence <= 2.0, "presence_penalty must be between -2 and 2", "presence_penalty")
    frequency = req.frequency_penalty or 0.0
    _check(-2.0 <= frequency <= 2.0, "frequency_penalty must be between -2 and 2", "frequency_penalty")
    repetition = 1.0 if req.repetition_penalty is None else req.repetition_penalty
    _check(0.0 < repetition <= 2.0, "repetition_penalty must be in (0, 2]", "repetition_penalty")
    _check(0 <= req.min_tokens <= max_tokens, "min_tokens must be between 0 and max_tokens", "min_tokens")
    user_stop_ids = tuple(req.stop_token_ids or ())
    _check(all(0 <= t < vocab_size for t in user_stop_ids), f"stop_token_ids must be in [0, {vocab_size})",
           "stop_token_ids")
    # ignore_eos: the model's end tokens no longer stop generation; the user's own stop ids still do (vLLM).
    stop_ids = user_stop_ids if req.ignore_eos else tuple(dict.fromkeys((*eos_token_ids, *user_stop_ids)))
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                          min_p=min_p, seed=req.seed,
                          ignore_eos=req.ignore_eos, stop_token_ids=stop_ids, presence_penalty=presence,
                          frequency_penalty=frequency, repetition_penalty=repetition,
                          logit_bias=_logit_bias(req.logit_bias, vocab_size), min_tokens=req.min_tokens,
                          logprobs=_num_logprobs(req), structured=_structured(req, tools),
                          allowed_token_ids=_allowed_ids(req.allowed_token_ids, vocab_size),
                          bad_words_token_ids=bad_words_token_ids(req.bad_words or (), encode, vocab_size),
                          prompt_logprobs=_num_prompt_logprobs(req))


def guided_field(req: ChatCompletionRequest | CompletionRequest, tools: ToolPlan | None) -> str:
    """The field that asked for guided decoding, for refusal_for_engines."""
    if tools is not None and tools.structured is not None:
        return "tool_choice"
    return "structured_outputs" if req.structured_outputs is not None else "response_format"


def _allowed_ids(ids: list[int] | None, vocab_size: int) -> tuple[int, ...]:
    if ids is None:
        return ()
    _check(bool(ids), "allowed_token_ids must not be empty", "allowed_token_ids")
    _check(all(0 <= t < vocab_size for t in ids), f"allowed_token_ids must be in [0, {vocab_size})",
           "allowed_token_ids")
    return tuple(dict.fromkeys(ids))


def bad_words_token_ids(words: list[str] | tuple[str, ...], encode: Callable[[str], list[int]] | None,
                        vocab_size: int) -> tuple[tuple[int, ...], ...]:
    """vLLM's SamplingParams.update_from_tokenizer: each word as it starts the text and, when that tokenizes
    differently but to as many tokens, after a space (a word inside the text)."""
    if not words:
        return ()
    _check(encode is not None, "bad_words needs the model's tokenizer", "bad_words")
    assert encode is not None
    _check(all(words), "bad_words cannot contain an empty string", "bad_words")
    out: list[list[int]] = []
    for word in dict.fromkeys(words):
        for prefix in ("", " "):
            ids = encode(prefix + word.lstrip())
            if not ids:
                _check(bool(prefix), "bad_words entries must tokenize to at least one token", "bad_words")
                continue
            if not prefix or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    _check(len(out) <= MAX_BAD_WORDS, f"too many bad words after tokenization: {len(out)}; the most is "
           f"{MAX_BAD_WORDS}", "bad_words")
    _check(all(0 <= t < vocab_size for ids in out for t in ids), "bad_words tokenize outside the vocabulary",
           "bad_words")
    return tuple(tuple(ids) for ids in out)


def _num_prompt_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """vLLM's prompt_logprobs, or with echo the request's (top_)logprobs; not streamed (vLLM refuses it)."""
    num = req.prompt_logprobs
    if num is None and req.echo:  # vLLM's chat: top_logprobs, 0 when unset
        num = (req.top_logprobs or 0) if isinstance(req, ChatCompletionRequest) else req.logprobs
    if num is None:
        return None
    _check(num >= 0 or num == -1, "prompt_logprobs must be a positive value or -1", "prompt_logprobs")
    _check(num != -1 and num <= MAX_LOGPROBS, f"prompt_logprobs must be at most {MAX_LOGPROBS}",
           "prompt_logprobs")
    _check(not (req.stream and req.prompt_logprobs), "prompt_logprobs are not available when stream=True",
           "prompt_logprobs")
    return num


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise ApiError(400, message, param=param)


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    if not bias:
        return {}
    _check(len(bias) <= MAX_LOGIT_BIAS, f"logit_bias has more than {MAX_LOGIT_BIAS} entries", "logit_bias")
    out = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise ApiError(400, f"logit_bias key {key!r} is not a token id", param="logit_bias") from None
        _check(0 <= token_id < vocab_size, f"logit_bias token id {token_id} is outside [0, {vocab_size})",
               "logit_bias")
        _check(-100.0 <= value <= 100.0, f"logit_bias of {token_id} must be between -100 and 100", "logit_bias")
        out[token_id] = float(value)
    return out


def _num_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """Alternatives per token (None: no logprobs). Chat: logprobs=true plus top_logprobs; completions: an int."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None:
            _check(req.logprobs, "top_logprobs needs logprobs=true", "top_logprobs")
            _check(0 <= req.top_logprobs <= MAX_LOGPROBS, f"top_logprobs must be between 0 and {MAX_LOGPROBS}",
                   "top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None
    if req.logprobs is None:
        return None
    _check(0 <= req.logprobs <= MAX_LOGPROBS, f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
    return req.logprobs


def _structured(req: ChatCompletionRequest | CompletionRequest, tools: ToolPlan | None) -> StructuredOutput | None:
    fmt = req.response_format
    if tools is not None and tools.structured is not None:
        _check(fmt is None or fmt.type == "text", "response_format cannot be combined with a forced tool call",
               "response_format")
        _check(req.structured_outputs is None, "structured_outputs cannot be combined with a forced tool call",
               "structured_outputs")
        return tools.structured
    if req.structured_outputs is not None:
        # vLLM adds response_format's constraint to structured_outputs', and refuses two constraints.
        _check(fmt is None or fmt.type == "text", "only one kind of structured outputs constraint may be set: "
               "response_format or structured_outputs", "structured_outputs")
        return structured_outputs(req.structured_outputs)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutput(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise ApiError(400, "response_format json_schema needs json_schema.schema", param="response_format")
    _check_schema(fmt.json_schema.schema, "response_format")
    return StructuredOutput(json_schema=orjson.dumps(fmt.json_schema.schema).decode())


def structured_outputs(so: StructuredOutputs) -> StructuredOutput:
    """vLLM's ``structured_outputs`` field, checked as vLLM's StructuredOutputsParams checks it."""
    kinds = [name for name, value in (("json", so.json), ("regex", so.regex), ("choice", so.choice),
                                      ("grammar", so.grammar), ("json_object", so.json_object),
                                      ("structural_tag", so.structural_tag)) if value is not None]
    _check(len(kinds) == 1, "structured_outputs needs exactly one constraint of json, regex, choice, grammar, "
           f"json_object, structural_tag; got {len(kinds)}", "structured_outputs")
    options = {"disable_any_whitespace": so.disable_any_whitespace,
               "disable_additional_properties": so.disable_additional_properties,
               "whitespace_pattern": so.whitespace_pattern or ""}
    if so.json is not None:
        schema = orjson.loads(so.json) if isinstance(so.json, str) else so.json
        _check_schema(schema, "structured_outputs")
        return StructuredOutput(json_schema=orjson.dumps(schema).decode(), **options)
    if so.regex is not None:  # the engine's grammar compiler judges the pattern (its dialect, not Python's)
        return StructuredOutput(regex=so.regex, **options)
    if so.choice is not None:
        _check(bool(so.choice), "structured_outputs choice must not be empty", "structured_outputs")
        return StructuredOutput(choice=tuple(so.choice), **options)
    if so.grammar is not None:
        _check(bool(so.grammar.strip()), "structured_outputs grammar must not be empty", "structured_outputs")
        return StructuredOutput(grammar=so.grammar, **options)
    if so.structural_tag is not None:
        return StructuredOutput(structural_tag=so.structural_tag, **options)
    return StructuredOutput(json_object=True, **options)


def _check_schema(schema: Any, param: str) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ApiError(400, f"{param} schema is not a valid JSON Schema: {exc.message}", param=param) from exc


def refusal_for_engines(sampling: SamplingParams, engines: set[str], guided_by: str = "response_format"
                        ) -> ApiError | None:
    """A 400 naming the first field some engine serving the model cannot honour, or None. ``guided_by``: the
    field that asked for guided decoding (response_format, or tool_choice for a forced tool call)."""
    asked = {
        "presence_penalty": sampling.presence_penalty != 0.0,
        "frequency_penalty": sampling.frequency_penalty != 0.0,
        "repetition_penalty": sampling.repetition_penalty != 1.0,
        "response_format": sampling.structured is not None,
        "allowed_token_ids": bool(sampling.allowed_token_ids),
        "bad_words": bool(sampling.bad_words_token_ids),
        "prompt_logprobs": sampling.prompt_logprobs is not None,
    }
    for engine in sorted(engines):
        for name in _ENGINE_UNSUPPORTED.get(engine, ()):
            if asked.get(name):
                param = guided_by if name == "response_format" else name
                return ApiError(400, f"{param} is not supported by this server's {engine} engine", param=param,
                                code="unsupported_field")
    return None


def engines_of(workers: Any, model: str) -> set[str]:
    """Engine kinds (WorkerInfo.engine) of the registered workers that serve ``model``."""
    if workers is None:
        return set()
    return {w.engine for w in workers.workers if w.model == model}
