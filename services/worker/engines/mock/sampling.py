"""The mock engine's sampling controls: which it honours, and the next token (with logprobs) under them.

The mock has no logits. It models one: the hashed next token (``tokens.next_token_id``) scores
``_BASE_LOGIT`` above every other token, whose score is 0; ``logit_bias`` adds to those scores, and stop ids
are masked until ``min_tokens`` outputs exist (as vLLM does). The winner is a pure function of the sequence,
the seed and the request's controls, so disaggregated and aggregated runs still agree token for token.

top_k and min_p are honoured as they are: the mock's winner is its distribution's likeliest token, which both
keep. Penalties, structured outputs, allowed_token_ids, bad_words and prompt logprobs need a real model's
distribution: the mock refuses them (``EngineError``; the frontend answers such requests with a 400 before they
reach a mock worker).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.errors import EngineError
from common.protocol import SamplingParams, TokenLogprobs
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.tokens import next_token_id

# Score of the hashed token above the others (so a bias above it makes another token win).
_BASE_LOGIT = 10.0


def unsupported(sampling: SamplingParams) -> str | None:
    """The first control the mock cannot honour, by its OpenAI name, or None."""
    if sampling.presence_penalty != 0.0:
        return "presence_penalty"
    if sampling.frequency_penalty != 0.0:
        return "frequency_penalty"
    if sampling.repetition_penalty != 1.0:
        return "repetition_penalty"
    if sampling.structured is not None:
        return "response_format"
    if sampling.allowed_token_ids:
        return "allowed_token_ids"
    if sampling.bad_words_token_ids:
        return "bad_words"
    if sampling.prompt_logprobs is not None:
        return "prompt_logprobs"
    return None


def check_supported(request_id: str, sampling: SamplingParams) -> None:
    name = unsupported(sampling)
    if name is not None:
        raise EngineError(f"request {request_id!r}: the mock engine does not support {name}")


def next_token(token_ids: Sequence[int], num_outputs: int, sampling: SamplingParams,
               config: MockEngineConfig) -> tuple[int, TokenLogprobs | None]:
    """The token after ``token_ids`` (of which the last ``num_outputs`` are outputs) and, when asked, its
    logprobs."""
    hashed = next_token_id(token_ids, sampling.seed, config)
    if not sampling.logit_bias and sampling.logprobs is None and (
            num_outputs >= sampling.min_tokens or not sampling.stop_token_ids):
        return hashed, None  # nothing reshapes the modelled distribution: its likeliest token, as below
    masked = frozenset(sampling.stop_token_ids) if num_outputs < sampling.min_tokens else frozenset()
    scores = _scores(hashed, sampling.logit_bias, masked)
    if scores and max(scores.values()) >= 0.0:
        chosen = max(scores, key=lambda t: (scores[t], t == hashed, -t))
    else:
        # Every token the mock names scores below an unnamed one: take a deterministic unnamed token.
        chosen = _unnamed(token_ids, sampling, config, set(scores) | masked)
        scores[chosen] = 0.0
    if sampling.logprobs is None:
        return chosen, None
    return chosen, _logprobs(chosen, scores, sampling.logprobs, config.vocab_size)


def _scores(hashed: int, logit_bias: dict[int, float], masked: frozenset[int]) -> dict[int, float]:
    scores = {token_id: bias for token_id, bias in logit_bias.items() if token_id not in masked}
    if hashed not in masked:
        scores[hashed] = _BASE_LOGIT + logit_bias.get(hashed, 0.0)
    return scores


def _unnamed(token_ids: Sequence[int], sampling: SamplingParams, config: MockEngineConfig,
             named: set[int]) -> int:
    if len(named) >= config.vocab_size:
        raise EngineError("logit_bias and min_tokens leave the mock engine no token to pick")
    salt = 1
    while True:
        candidate = next_token_id((*token_ids[-7:], -salt & 0xFFFFFFFF), sampling.seed, config)
        if candidate not in named:
            return candidate
        salt += 1


def _logprobs(chosen: int, scores: dict[int, float], num_top: int, vocab_size: int) -> TokenLogprobs:
    """Logprobs of the modelled distribution: named tokens at their scores, every other token at 0."""
    num_unnamed = vocab_size - len(scores)
    log_z = math.log(sum(math.exp(s) for s in scores.values()) + num_unnamed)
    # Unnamed tokens tie at score 0: the lowest ids stand for them.
    unnamed = [t for t in range(min(vocab_size, len(scores) + num_top)) if t not in scores][:num_top]
    candidates = [*scores.items(), *((t, 0.0) for t in unnamed)]
    ranked = sorted(candidates, key=lambda item: (-item[1], item[1] == 0.0 and item[0] not in scores, item[0]))
    top = [(token_id, score - log_z) for token_id, score in ranked[:num_top]]
    return TokenLogprobs(token_id=chosen, logprob=scores[chosen] - log_z, top=tuple(top))
