"""What a request's budget counts when its output tokens are made in more than one place: the rule, written once.

``SamplingParams.max_tokens`` and ``min_tokens`` count every output token of the request, wherever it is made;
a ``Generate`` always carries them as the client's request decided them (services/frontend/token_budget.py),
and each hop applies this module:

- Prefill (``Generate.prefill_only``): the engine makes only the request's first output token
  (``prefill_sampling``); that token ends the whole request when it is a stop token or the budget is one
  (``prefill_finish``), else the frontend hands it off.
- Hand-off (``common.protocol.Handoff``): the decode worker gets the prefill's prompt and the whole budget, plus
  the first token. An engine serves it one of two ways, the same tokens either way:
  - as its continuation (the mock engine): ``continuation(prompt, sampling, (first,))``, the first token
    appended to the prompt and counted off the budget;
  - by making the first token again, forced (``ForcedFirst``; vLLM: its NixlConnector pulls exactly the
    prefill's blocks only for the prefill's own prompt, and recomputes its last position). The budget is then
    the request's as sent, since the forced token is one of its output tokens (so presence and frequency
    penalties see it as one), and the engine drops it from what it emits: the client has it.
- Migration: a request whose decode worker was lost resumes elsewhere from the tokens streamed so far, as
  ``continuation(prompt, sampling, streamed)`` (those tokens are prompt tokens there).

tests/test_layering.py fails when a module elsewhere does budget arithmetic of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace

from common.errors import EngineError
from common.protocol import FinishReason, SamplingParams


def continuation(token_ids: tuple[int, ...], sampling: SamplingParams, known_ids: tuple[int, ...] | list[int]
                 ) -> tuple[tuple[int, ...], SamplingParams]:
    """The prompt and sampling that go on from ``known_ids``, output tokens the request has already made:
    they join the prompt, and max_tokens and min_tokens count what is still to come (every other control
    applies unchanged; the prompt's logprobs came with the first slice)."""
    if not known_ids:
        return token_ids, sampling
    num_known = len(known_ids)
    return token_ids + tuple(known_ids), replace(sampling, max_tokens=sampling.max_tokens - num_known,
                                                 min_tokens=max(0, sampling.min_tokens - num_known),
                                                 prompt_logprobs=None)


def prefill_sampling(sampling: SamplingParams) -> SamplingParams:
    """What a prefill-only engine request samples with: one output token (min_tokens capped to it)."""
    return replace(sampling, max_tokens=1, min_tokens=min(sampling.min_tokens, 1))


def prefill_finish(finish_reason: FinishReason, sampling: SamplingParams) -> FinishReason | None:
    """How the prefill's one token ends the whole request: "stop" (a stop token) always does, "length" only
    when the client asked for one token; None: the request goes on, handed off."""
    if finish_reason == "stop":
        return "stop"
    return "length" if sampling.max_tokens <= 1 else None


@dataclass(slots=True)
class ForcedFirst:
    """A hand-off served by making its first token again: ``token_id`` is forced at the request's first
    sampling step, and ``emitted`` drops it from the engine's output."""

    request_id: str
    token_id: int
    pending: bool = True  # the forced token has not come out yet

    def emitted(self, token_ids: tuple[int, ...], per_token: tuple = ()) -> tuple[tuple[int, ...], tuple]:
        """What the engine's new tokens (and their per-token ``per_token`` items, e.g. logprobs, which the
        prefill worker sent for the first token already) give the client."""
        if not self.pending or not token_ids:
            return token_ids, per_token
        if token_ids[0] != self.token_id:
            raise EngineError(f"{self.request_id}: the decode engine made {token_ids[0]} where the prefill's token "
                              f"{self.token_id} was forced")
        self.pending = False
        return token_ids[1:], per_token[1:]
