"""How long a sequence (prompt + output tokens) this graph can serve: the model's context, capped by its workers.

A worker serves at most its engine's ``max_model_len`` (vLLM's may be below the model's position embeddings:
capped by the KV cache it was given), and it registers that figure. A request that does not fit is the
client's error (400 naming the limit), not a retryable 503 from a worker deep in the pipeline.
"""

from __future__ import annotations

from common.protocol import WorkerList


def served_context_len(model_max_len: int, workers: WorkerList | None, model: str) -> int:
    """The smallest ``max_model_len`` a worker of ``model`` registered (any worker may be chosen for a request, so
    the smallest is the one every route honours); the model config's context while none has. The engines'
    word wins over the config's, as in `vllm serve`: their ``--max-model-len`` may exceed the config (rope
    scaling, VLLM_ALLOW_LONG_MAX_MODEL_LEN) or cut it."""
    limits = [w.max_model_len for w in workers.workers if w.model == model and w.max_model_len > 0] if workers else []
    return min(limits) if limits else model_max_len


# Prompts of fewer characters are templated and tokenized on the event loop: under ~0.1 ms of work, less than
# a thread-pool hand-off costs. Longer ones go to the pool (HF tokenizers releases the GIL while encoding).
OFFLOAD_MIN_CHARS = 4096
# The same bound where the fast encoder (fast_bpe.py, ~0.04 ms a 1,000 characters) runs instead: it holds the
# GIL, so a pool thread would stall the loop all the same below the size where it splits with the GIL released.
FAST_OFFLOAD_MIN_CHARS = 16384


def min_prompt_tokens(num_chars: int, max_token_chars: int) -> int:
    """A lower bound on the tokens of a text of ``num_chars`` characters, known before tokenizing it.

    One token stands for at most ``max_token_chars`` characters (its vocabulary string, at least as long as
    the text it covers, in byte-level BPE and SentencePiece vocabularies), so a prompt too long for the context
    by this bound is rejected without spending seconds on a multi-megabyte template and tokenization.
    """
    return -(-num_chars // max(1, max_token_chars))


def offload_tokenization(num_chars: int, min_chars: int = OFFLOAD_MIN_CHARS) -> bool:
    return num_chars >= min_chars


def truncate_prompt(token_ids: list[int] | tuple[int, ...], truncate: int | None, side: str | None,
                    max_len: int) -> list[int] | tuple[int, ...]:
    """vLLM's ``truncate_prompt_tokens``: keep the prompt's last N tokens (``side`` "left", vLLM's default for
    generation) or its first N ("right"); -1 keeps as many as the context allows with one output token.
    None: the prompt as it is. Raises ValueError for an N over the context."""
    if truncate is None:
        return token_ids
    if truncate > max_len:
        raise ValueError(f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len={max_len}")
    keep = max(0, max_len - 1) if truncate < 0 else truncate
    if keep >= len(token_ids):
        return token_ids
    if keep == 0:
        return token_ids[:0]
    return token_ids[-keep:] if (side or "left") == "left" else token_ids[:keep]
