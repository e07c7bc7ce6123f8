"""A vLLM logits processor that forces a request's first output token.

Why: in disaggregated serving the prefill worker has already produced (and streamed) the first token, and the
decode request is its hand-off (common/continuation.py: the rule; ``ForcedFirst`` drops the forced token). The
decode engine is given the *same* prompt as the prefill engine, so vLLM's NixlConnector pulls exactly the
blocks the prefill engine holds and recomputes only the last prompt position, whose logits pick the first
token again. Forcing that pick to the prefill worker's token keeps the decode continuation conditioned on
what the user already saw, for greedy and sampled requests alike. For seeded sampling the forced step still
draws from the request's generator, so a seeded disaggregated run matches a seeded aggregated run.

The engine loads this class by its qualified name (it runs inside vLLM's engine-core process); a request opts
in with ``SamplingParams.extra_args[FORCED_TOKEN_KEY] = token_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm.config import VllmConfig

FORCED_TOKEN_KEY = "splitserve_forced_first_token_id"
QUALNAME = "services.worker.engines.vllm.first_token:ForceFirstToken"


class ForceFirstToken(LogitsProcessor):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        # Batch row -> (forced token id, live reference to the request's output token ids).
        self._forced: dict[int, tuple[int, Sequence[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        token_id = (sampling_params.extra_args or {}).get(FORCED_TOKEN_KEY)
        if token_id is not None and (not isinstance(token_id, int) or token_id < 0):
            raise ValueError(f"{FORCED_TOKEN_KEY} must be a non-negative int, got {token_id!r}")

    def is_argmax_invariant(self) -> bool:
        # It changes which token wins, so it must run for greedy requests too.
        return False

    @staticmethod
    def _new_state(
        params: SamplingParams, _prompt_ids: list[int] | None, output_ids: list[int]
    ) -> tuple[int, Sequence[int]] | None:
        token_id = (params.extra_args or {}).get(FORCED_TOKEN_KEY)
        if token_id is None or len(output_ids) > 0:
            return None
        return int(token_id), output_ids

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        # vLLM calls this and ``apply`` every step for the whole batch (the processor is not argmax-invariant):
        # a step with no row forced and no batch change returns at once.
        if batch_update is None and not self._forced:
            return
        process_dict_updates(self._forced, batch_update, self._new_state)
        if not self._forced:
            return
        # Once the first token exists the request samples normally.
        for row in [row for row, (_, out) in self._forced.items() if len(out) > 0]:
            del self._forced[row]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._forced:
            return logits
        for row, (token_id, _) in self._forced.items():
            if row >= logits.shape[0]:
                continue  # the row is not sampled this step (e.g. still prefilling in chunks)
            # One finite logit: greedy picks it and any sampler gives it probability 1.
            logits[row].fill_(float("-inf"))
            logits[row, token_id] = 0.0
        return logits
