"""How long a sequence (prompt + output tokens) this graph can serve: the model's context, capped by its workers.

A worker serves at most its engine's ``max_model_len`` (vLLM's may be below the model's position embeddings:
capped by the KV cache it was given), and it registers that figure. A request that does not fit is the
client's error (400 naming the limit), not a retryable 503 from a worker deep in the pipeline.
"""

from __future__ import annotations

from common.protocol import WorkerList


def served_context_len(model_max_len: int, workers: WorkerList | None, model: str) -> int:
    """The model's context, or the smallest ``max_model_len`` a worker of ``model`` registered if less; any
    worker may be chosen for a request, so the smallest is the one every route honours."""
    limits = [w.max_model_len for w in workers.workers if w.model == model and w.max_model_len > 0] if workers else []
    return min([model_max_len, *limits])
