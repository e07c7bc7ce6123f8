"""One request's engine outputs on their way to its frontend: counted, shaped as ``Tokens``, queued in the outbox.

An engine that can (the mock) hands each output to ``take`` from inside its step, the request's task asleep until
the end: a task switch per token was ~40% of a zero-delay worker's CPU (each step woke every running request's
task once). ``take`` declines while the frontend's outbox is over its limits, and from then on the engine yields
the request's outputs to its task, which awaits room before each (``put``): a frontend that reads slowly pauses
its requests' output, and one that reads nothing for the stall timeout gets them aborted (``PeerStalled``).
An engine that cannot (vLLM: its own ``generate`` is per request) yields every output to ``put``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.outbox import PeerOutbox
from common.protocol import FinishReason, Tokens
from services.worker.engine import EngineOutput


@dataclass(slots=True, eq=False)
class OutputForwarder:
    identity: bytes  # the frontend's
    outbox: PeerOutbox
    on_output: Callable[[EngineOutput], None]  # called first for each output (its trace, the pull's end)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: FinishReason | None = None

    def take(self, out: EngineOutput) -> bool:
        """The engine's sink: forward ``out`` now, or False to have it yielded to the request's task instead."""
        if self.outbox.full(self.identity):
            return False
        self._forward(out)
        return True

    async def put(self, out: EngineOutput) -> None:
        """Forward ``out`` once the frontend has room (at once, nearly always); raises PeerStalled."""
        if self.outbox.full(self.identity):
            await self.outbox.room(self.identity)
        self._forward(out)

    def _forward(self, out: EngineOutput) -> None:
        self.on_output(out)
        self.num_output_tokens += len(out.token_ids)
        self.num_cached_tokens = out.num_cached_tokens
        if out.finish_reason is not None:
            self.finish_reason = out.finish_reason
        self.outbox.put(self.identity, Tokens(  # sent at the end of this loop turn, batched with others
            request_id=out.request_id, token_ids=out.token_ids, finish_reason=out.finish_reason,
            num_prompt_tokens=out.num_prompt_tokens, num_cached_tokens=out.num_cached_tokens,
            kv_transfer=out.kv_transfer, transfer_failed=out.transfer_failed,
            logprobs=out.logprobs, prompt_logprobs=out.prompt_logprobs))
