"""Continuous batching for the mock engine, after vLLM v1's scheduler. Pure and synchronous.

Each step has a token budget. Running sequences go first, in arrival order (decodes and unfinished chunked
prefills), so decodes are never starved by new prompts; waiting sequences then start while budget, sequence
slots and blocks last, their prompt chunked to the budget. When a running sequence needs a block and none is
free, the newest running sequence is preempted: its blocks are freed and it goes back to the head of the
queue to be recomputed (its full blocks usually survive in the prefix cache).

Waiting sequences start in priority order (lower first, arrival order among equals); a preempted one goes back to
the head.

A sequence whose prompt KV comes from another worker (``kv_transfer``) gets its blocks, then waits in
``loading`` (the step plan lists it) until the engine calls ``finish_load``; only its last token is computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from common.protocol import FinishReason
from services.worker.engines.mock.block_manager import BlockManager


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    # Tokens computed per step, prefill and decode together.
    max_num_batched_tokens: int = 2048


@dataclass(frozen=True, slots=True)
class SeqSpec:
    """A sequence to run, as the engine hands it over."""

    seq_id: str
    token_ids: tuple[int, ...]
    # Tokens this scheduler may append (prefill_only sequences append exactly one).
    max_tokens: int
    # Empty when the request ignores EOS.
    stop_token_ids: frozenset[int] = frozenset()
    prefill_only: bool = False
    # The KV of every token but the last is pulled from a prefill worker instead of computed.
    kv_transfer: bool = False
    # The KV of the first this-many tokens (whole blocks, < len(token_ids)) is onboarded from a KV tier
    # (kvtier) instead of computed; the rest of the prompt is prefilled after it lands. They count as cached.
    num_onboard_tokens: int = 0
    # Lower starts earlier among waiting sequences (vLLM's priority scheduling); equal ones in arrival order.
    priority: int = 0
    # The seed its blocks hash under (a LoRA adapter's: common/hashing.py adapter_seed); None: the engine's.
    hash_seed: int | None = None

    @property
    def num_load_tokens(self) -> int:
        """Tokens whose KV a load brings (0: none)."""
        return len(self.token_ids) - 1 if self.kv_transfer else self.num_onboard_tokens


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq_id: str
    num_new_tokens: int
    # The chunk ends the sequence's known tokens, so the step samples its next token.
    samples: bool


@dataclass(frozen=True, slots=True)
class KvLoad:
    """A transfer to start: the KV of ``num_tokens`` tokens into ``block_ids`` (local cache hits excluded)."""

    seq_id: str
    num_tokens: int
    block_ids: tuple[int, ...]
    # From a KV tier (kvtier), not from a prefill worker.
    onboard: bool = False


@dataclass(frozen=True, slots=True)
class StepPlan:
    prefills: tuple[PrefillChunk, ...] = ()
    # Sequences computing one token each (their last sampled one) and sampling the next.
    decode_seq_ids: tuple[str, ...] = ()
    loads: tuple[KvLoad, ...] = ()
    preempted_seq_ids: tuple[str, ...] = ()
    # Tokens of KV the decodes attend to (the timing model's decode term).
    num_decode_kv_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_new_tokens for chunk in self.prefills)

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + len(self.decode_seq_ids)

    @property
    def is_empty(self) -> bool:
        return not (self.prefills or self.decode_seq_ids or self.loads)


class SeqOutput(msgspec.Struct, frozen=True):  # one a token: a Struct builds ~5x faster than a frozen dataclass
    seq_id: str
    token_id: int
    finish_reason: FinishReason | None
    # Prompt tokens found in the prefix cache when the sequence first started.
    num_cached_tokens: int
    # The sequence's blocks when it finished (the KV a decode worker pulls); empty while running.
    block_ids: tuple[int, ...] = ()


# Compared by identity: queues remove the very object.
@dataclass(slots=True, eq=False)
class _Seq:
    spec: SeqSpec
    token_ids: list[int]
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    started: bool = False
    # Still to pull its prompt KV (cleared once pulled, or when a preemption makes it recompute).
    pending_transfer: bool = False

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.spec.token_ids)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        if config.max_num_seqs <= 0 or config.max_num_batched_tokens <= 0:
            raise ValueError(f"scheduler limits must be positive: {config}")
        self.config = config
        self.blocks = block_manager
        self._seqs: dict[str, _Seq] = {}
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._loading: dict[str, _Seq] = {}
        # The sequences the last plan computes, by identity: a request aborted during the step and sent again under
        # the same id (a migrated stream) is another sequence, and that step's results are not its own.
        self._planned: dict[str, _Seq] = {}

    # ------------------------------------------------------------------------------------------ figures

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_loading(self) -> int:
        return len(self._loading)

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def token_ids(self, seq_id: str) -> list[int]:
        """The sequence's prompt and output so far (the engine reads it to pick the next token)."""
        return self._seqs[seq_id].token_ids

    def num_queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: waiting sequences' (less what a load brings; prefix-cache hits are
        only known when they start) and the rest of running sequences' chunked prefills."""
        waiting = sum(len(seq.token_ids) - seq.spec.num_load_tokens for seq in self._waiting)
        running = sum(len(seq.token_ids) - seq.num_computed_tokens
                      for seq in self._running if not seq.num_output_tokens)
        return waiting + running

    def num_active_blocks(self) -> int:
        """Blocks held by sequences past their prompt (the router's decode-load term)."""
        return sum(self.blocks.num_seq_blocks(seq.spec.seq_id) for seq in self._running if seq.num_output_tokens)

    # ------------------------------------------------------------------------------------------ changes

    def add(self, spec: SeqSpec) -> None:
        if spec.seq_id in self._seqs:
            raise ValueError(f"sequence {spec.seq_id!r} is already scheduled")
        if not spec.token_ids or (spec.kv_transfer and len(spec.token_ids) < 2):
            raise ValueError(f"sequence {spec.seq_id!r} has too few tokens")
        if not 0 <= spec.num_onboard_tokens < len(spec.token_ids):
            raise ValueError(f"sequence {spec.seq_id!r}: num_onboard_tokens must leave a token to compute")
        seq = _Seq(spec=spec, token_ids=list(spec.token_ids), pending_transfer=spec.num_load_tokens > 0)
        self._seqs[spec.seq_id] = seq
        # Behind every waiting sequence of the same or a lower priority value (all 0: an append).
        index = len(self._waiting)
        while index and self._waiting[index - 1].spec.priority > spec.priority:
            index -= 1
        self._waiting.insert(index, seq)

    def abort(self, seq_id: str) -> bool:
        """Drop a sequence wherever it is and free its blocks. False if unknown."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return False
        if seq in self._running:
            self._running.remove(seq)
        elif seq_id in self._loading:
            del self._loading[seq_id]
        else:
            self._waiting.remove(seq)
        self.blocks.free(seq_id)
        return True

    def finish_load(self, seq_id: str) -> bool:
        """The KV of a loading sequence has arrived: it joins the running batch. False if not loading."""
        seq = self._loading.pop(seq_id, None)
        if seq is None:
            return False
        seq.num_computed_tokens = seq.spec.num_load_tokens
        seq.pending_transfer = False
        if not seq.spec.kv_transfer:
            # Onboarded from a KV tier: like a prefix-cache hit (vLLM counts external hits as cached too).
            seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed_tokens)
        self.blocks.commit(seq_id, seq.token_ids, seq.num_computed_tokens)
        self._running.append(seq)
        return True

    def fail_load(self, seq_id: str) -> bool:
        """A loading sequence's KV did not arrive (intact): free its blocks, recompute its prompt here (at the head
        of the queue, as a preempted one). False if not loading."""
        seq = self._loading.pop(seq_id, None)
        if seq is None:
            return False
        self._preempt(seq)
        return True

    # ----------------------------------------------------------------------------------------- schedule

    def schedule(self) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        prefills: list[PrefillChunk] = []
        decodes: list[str] = []
        preempted: list[str] = []
        loads: list[KvLoad] = []
        num_decode_kv_tokens = 0

        index = 0
        while index < len(self._running) and budget > 0:
            seq = self._running[index]
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            target = seq.num_computed_tokens + num_new
            while not self.blocks.append(seq.spec.seq_id, target):
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim.spec.seq_id)
                if victim is seq:
                    break
            else:
                if num_new == 1 and seq.num_output_tokens:
                    decodes.append(seq.spec.seq_id)
                    num_decode_kv_tokens += len(seq.token_ids)
                else:
                    prefills.append(PrefillChunk(seq.spec.seq_id, num_new, target == len(seq.token_ids)))
                budget -= num_new
                index += 1
                continue
            break  # the sequence preempted itself: nothing else can grow this step

        # New sequences only when nobody was preempted: the pool is full and they would thrash it.
        while self._waiting and budget > 0 and not preempted:
            if len(self._running) + len(self._loading) >= self.config.max_num_seqs:
                break
            seq = self._waiting[0]
            seq_id = seq.spec.seq_id
            # At least the last token is computed: it is the one that yields logits.
            match = self.blocks.match_prefix(seq.token_ids[:-1], seq.spec.hash_seed)
            if seq.pending_transfer and match.num_cached_tokens < seq.spec.num_load_tokens:
                num_kv_tokens = seq.spec.num_load_tokens
                if not self.blocks.allocate(seq_id, match, num_kv_tokens, seq.spec.hash_seed):
                    break
                self._waiting.popleft()
                self._start(seq, match.num_cached_tokens)
                self._loading[seq_id] = seq
                num_load_tokens = num_kv_tokens - match.num_cached_tokens
                loads.append(KvLoad(seq_id, num_load_tokens, self.blocks.block_ids(seq_id),
                                    onboard=not seq.spec.kv_transfer))
                continue
            num_new = min(len(seq.token_ids) - match.num_cached_tokens, budget)
            target = match.num_cached_tokens + num_new
            if not self.blocks.allocate(seq_id, match, target, seq.spec.hash_seed):
                break
            self._waiting.popleft()
            self._start(seq, match.num_cached_tokens)
            seq.pending_transfer = False
            self._running.append(seq)
            prefills.append(PrefillChunk(seq_id, num_new, target == len(seq.token_ids)))
            budget -= num_new

        self._planned = {seq_id: self._seqs[seq_id] for seq_id in (*(c.seq_id for c in prefills), *decodes)}
        return StepPlan(
            prefills=tuple(prefills),
            decode_seq_ids=tuple(decodes),
            loads=tuple(loads),
            preempted_seq_ids=tuple(preempted),
            num_decode_kv_tokens=num_decode_kv_tokens,
        )

    def update(self, plan: StepPlan, new_token_ids: Mapping[str, int]) -> tuple[SeqOutput, ...]:
        """Apply a computed step. ``new_token_ids`` holds the sampled token of every sampling sequence.

        Sequences aborted since ``schedule`` are skipped, and so is a sequence added since under an aborted one's id.
        Finished sequences are freed.
        """
        outputs: list[SeqOutput] = []
        chunks = [(chunk.seq_id, chunk.num_new_tokens, chunk.samples) for chunk in plan.prefills]
        chunks += [(seq_id, 1, True) for seq_id in plan.decode_seq_ids]
        for seq_id, num_new, samples in chunks:
            seq = self._seqs.get(seq_id)
            if seq is None or seq is not self._planned.get(seq_id):
                continue
            seq.num_computed_tokens += num_new
            self.blocks.commit(seq_id, seq.token_ids, seq.num_computed_tokens)
            if not samples:
                continue
            if seq_id not in new_token_ids:
                raise ValueError(f"no sampled token for sequence {seq_id!r}")
            token_id = new_token_ids[seq_id]
            seq.token_ids.append(token_id)
            reason = self._finish_reason(seq, token_id)
            block_ids: tuple[int, ...] = ()
            if reason is not None:
                block_ids = self.blocks.block_ids(seq_id)
                self._running.remove(seq)
                del self._seqs[seq_id]
                self.blocks.free(seq_id)
            outputs.append(SeqOutput(seq_id, token_id, reason, seq.num_cached_tokens, block_ids))
        return tuple(outputs)

    # ---------------------------------------------------------------------------------------- internals

    @staticmethod
    def _finish_reason(seq: _Seq, token_id: int) -> FinishReason | None:
        if seq.spec.prefill_only:
            return "length"
        if token_id in seq.spec.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= seq.spec.max_tokens:
            return "length"
        return None

    @staticmethod
    def _start(seq: _Seq, num_cached_tokens: int) -> None:
        seq.num_computed_tokens = num_cached_tokens
        if not seq.started:
            seq.started = True
            seq.num_cached_tokens = num_cached_tokens

    def _preempt(self, seq: _Seq) -> None:
        self.blocks.free(seq.spec.seq_id)
        seq.num_computed_tokens = 0
        # Recompute locally: the prefill worker's copy may be gone, and our own blocks may still be cached.
        seq.pending_transfer = False
        self._waiting.appendleft(seq)
