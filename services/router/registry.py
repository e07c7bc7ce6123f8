"""The router's view of its workers: who is registered, with which role, and how loaded.

Pure bookkeeping with an injected clock, so it is tested with exact expectations.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

import msgspec

from common.errors import RegistrationRefused
from common.protocol import PROTOCOL_VERSION, BlockStored, KvEvent, Role, WorkerInfo, WorkerList, WorkerLoad
from services.router.policy import Candidate

DECODE_ROLES: frozenset[Role] = frozenset({"decode", "both"})
PREFILL_ROLES: frozenset[Role] = frozenset({"prefill"})


@dataclass(frozen=True, slots=True)
class WorkerEntry:
    info: WorkerInfo
    load: WorkerLoad
    last_seen_s: float
    # Requests routed here since the worker's last load report. Reports lag by up to one heartbeat, and a
    # burst would otherwise all land on the worker that looked idlest; the next report replaces the guess.
    num_routed_since_report: int = 0
    # Prompt tokens those routes asked this worker to prefill (added to its queued tokens likewise).
    num_tokens_routed_since_report: int = 0
    # Blocks of context of those routes that decode here (active blocks count every decoding sequence's whole
    # context). Free blocks are left as reported: a prefix-cache hit takes blocks the report counted as free
    # (evictable), and taking them off made the busy threshold skip the hot worker for a cold one
    # (bench/routing_sim.py: reuse 0.92 vs 0.95 and a longer TTFT tail at ISL 4,000).
    num_decode_blocks_since_report: int = 0
    # Draining workers get no new routes; they stay listed until they unregister or go silent.
    draining: bool = False
    # Hand-offs routed here (prefilled elsewhere), as (due monotonic s, the prompt's last block hash or None,
    # arrived). Until its KV arrives the worker cannot report one, and a report of no streams let the stall rule
    # prefill locally on an engine a stream was about to join (multi-turn: 230-320 ms gaps). One leaves at the
    # first report after its last block is stored there (KV events), or once past due.
    handoffs: tuple[tuple[float, int | None, bool], ...] = ()


def check_protocol_version(peer_id: str, version: int) -> None:
    """Refuses a peer that speaks another wire version (a mixed-release cluster), naming both versions."""
    if version != PROTOCOL_VERSION:
        raise RegistrationRefused(
            f"{peer_id} speaks protocol version {version} but this router speaks {PROTOCOL_VERSION}: "
            "run the same splitserve release on every process")


class Registry:
    def __init__(self) -> None:
        self._workers: dict[str, WorkerEntry] = {}

    def register(self, info: WorkerInfo, now_s: float) -> None:
        """Add or replace a worker. Refuses one that breaks its model's contract with the workers already here."""
        for other in self._workers.values():
            if other.info.model != info.model or other.info.worker_id == info.worker_id:
                continue
            if other.info.block_size != info.block_size:
                raise RegistrationRefused(
                    f"worker {info.worker_id} has block_size {info.block_size} but model {info.model!r} "
                    f"is served with block_size {other.info.block_size} (worker {other.info.worker_id})"
                )
            if other.info.hash_seed != info.hash_seed:
                raise RegistrationRefused(
                    f"worker {info.worker_id} has hash_seed {info.hash_seed} but model {info.model!r} "
                    f"uses {other.info.hash_seed} (worker {other.info.worker_id})"
                )
        self._workers[info.worker_id] = WorkerEntry(
            info=info, load=WorkerLoad(num_total_blocks=info.num_blocks, num_free_blocks=info.num_blocks),
            last_seen_s=now_s,
        )

    def set_role(self, worker_id: str, role: Role) -> bool:
        """Move a worker to another pool in place (its KV, load and index stay); False when unknown or unchanged."""
        entry = self._workers.get(worker_id)
        if entry is None or entry.info.role == role:
            return False
        self._workers[worker_id] = replace(entry, info=msgspec.structs.replace(entry.info, role=role))
        return True

    def set_adapters(self, worker_id: str, lora_names: tuple[str, ...] | None) -> bool:
        """The LoRA adapters a worker holds now (its heartbeat said; None: not said); False when unchanged."""
        entry = self._workers.get(worker_id)
        if entry is None or lora_names is None or entry.info.lora_names == lora_names:
            return False
        self._workers[worker_id] = replace(entry, info=msgspec.structs.replace(entry.info, lora_names=lora_names))
        return True

    def unregister(self, worker_id: str) -> bool:
        return self._workers.pop(worker_id, None) is not None

    def report(self, worker_id: str, load: WorkerLoad, now_s: float, draining: bool = False) -> bool:
        """Record a heartbeat; False when the worker is unknown (it must register again)."""
        entry = self._workers.get(worker_id)
        if entry is None:
            return False
        self._workers[worker_id] = replace(entry, load=load, last_seen_s=now_s, num_routed_since_report=0,
                                           num_tokens_routed_since_report=0, num_decode_blocks_since_report=0,
                                           draining=draining,
                                           handoffs=tuple(h for h in entry.handoffs if h[0] > now_s and not h[2]))
        return True

    def note_routed(self, worker_id: str, num_prefill_tokens: int = 0, num_decode_tokens: int = 0,
                    handoff: tuple[float, int | None] | None = None) -> None:
        """A request was routed here, with ``num_prefill_tokens`` prompt tokens for it to compute and, when it
        decodes here, ``num_decode_tokens`` tokens of context (its prompt); ``handoff``: it is prefilled
        elsewhere, (when it is due, its prompt's last block hash)."""
        entry = self._workers.get(worker_id)
        if entry is not None:
            block_size = max(entry.info.block_size, 1)
            handoffs = entry.handoffs + (() if handoff is None else ((*handoff, False),))
            self._workers[worker_id] = replace(
                entry, handoffs=handoffs, num_routed_since_report=entry.num_routed_since_report + 1,
                num_tokens_routed_since_report=entry.num_tokens_routed_since_report + num_prefill_tokens,
                num_decode_blocks_since_report=entry.num_decode_blocks_since_report
                + -(-num_decode_tokens // block_size))

    def note_stored(self, worker_id: str, events: tuple[KvEvent, ...]) -> None:
        """KV events from ``worker_id``: a hand-off whose last block it stored has arrived (its stream is in the
        worker's next report)."""
        entry = self._workers.get(worker_id)
        if entry is None or not entry.handoffs:
            return
        stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
        if any(not arrived and last in stored for _, last, arrived in entry.handoffs):  # else nothing to copy
            self._workers[worker_id] = replace(entry, handoffs=tuple(
                (due, last, arrived or last in stored) for due, last, arrived in entry.handoffs))

    def expire(self, now_s: float, timeout_s: float) -> list[str]:
        """Drop workers silent for longer than ``timeout_s``; returns their ids."""
        dead = [wid for wid, e in self._workers.items() if now_s - e.last_seen_s > timeout_s]
        for wid in dead:
            del self._workers[wid]
        return dead

    def get(self, worker_id: str) -> WorkerEntry | None:
        return self._workers.get(worker_id)

    def workers(self, model: str | None = None, roles: frozenset[Role] | None = None) -> list[WorkerEntry]:
        return [
            e for e in self._workers.values()
            if (model is None or e.info.model == model) and (roles is None or e.info.role in roles)
        ]

    def listing(self, request_id: str) -> WorkerList:
        """Every registered worker with its last load, and which of them drain (the ListWorkers answer)."""
        entries = self.workers()
        return WorkerList(request_id=request_id, workers=tuple(e.info for e in entries),
                          loads=tuple(e.load for e in entries),
                          draining=tuple(e.info.worker_id for e in entries if e.draining))

    def effective_load(self, entry: WorkerEntry) -> WorkerLoad:
        """The last report plus requests routed since, counted as waiting (and their prompt tokens as queued,
        where the engine counts queued tokens) and their contexts as decoding."""
        if entry.num_routed_since_report == 0:
            return entry.load
        load = entry.load
        waiting_tokens = load.num_waiting_tokens
        if waiting_tokens >= 0:
            waiting_tokens += entry.num_tokens_routed_since_report
        return msgspec.structs.replace(
            load, num_waiting=load.num_waiting + entry.num_routed_since_report, num_waiting_tokens=waiting_tokens,
            num_active_blocks=load.num_active_blocks + entry.num_decode_blocks_since_report)

    def candidates(self, model: str, roles: frozenset[Role], exclude_worker_ids: Collection[str] = (),
                   exclude_instance_ids: Collection[str] = (), lora_name: str = "") -> list[Candidate]:
        """What the policy chooses from: the model's workers in ``roles`` at their effective load, less the
        excluded workers and worker processes (instances) and the draining ones; with ``lora_name``, only
        those holding that adapter (an engine runs no adapter it has not loaded)."""
        return [
            Candidate(worker_id=e.info.worker_id, load=self.effective_load(e), node=e.info.node, zone=e.info.zone,
                      kv_bytes_per_token=e.info.kv_bytes_per_token, num_handoffs_due=len(e.handoffs))
            for e in self.workers(model, roles)
            if e.info.worker_id not in exclude_worker_ids and not e.draining
            and not (e.info.instance_id and e.info.instance_id in exclude_instance_ids)
            and (not lora_name or lora_name in e.info.lora_names)
        ]

    def models(self) -> list[str]:
        return sorted({e.info.model for e in self._workers.values()})

    def __len__(self) -> int:
        return len(self._workers)
