"""vLLM's KV cache events, translated to our block hashes (docs/architecture.md#contracts).

vLLM publishes ``KVEventBatch``es (msgpack) on a ZeroMQ PUB socket from its engine core. Its block hashes are
its own; ours are recomputed from the token ids each ``BlockStored`` carries, chained onto the parent's hash
(kept in a map from vLLM's hash to ours), under the seed of the LoRA adapter the event names (``lora_name``;
common/hashing.py adapter_seed). Removals and clears are mapped through the same table.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog
import zmq
import zmq.asyncio

from common.hashing import adapter_seed, chain_block_hashes
from common.protocol import AllCleared, BlockRemoved, BlockStored, KvEvent

log = structlog.get_logger(__name__)


class VllmKvEvents:
    """Subscribes to one engine's event stream; ``drain()`` returns wire events since the last call."""

    def __init__(self, endpoint: str, block_size: int, seed: int) -> None:
        self.endpoint = endpoint
        self._block_size = block_size
        self._seed = seed
        self._ours: dict[Any, int] = {}  # vLLM block hash -> our chained hash
        self._pending: list[KvEvent] = []
        self._num_unchained = 0
        self._task: asyncio.Task[None] | None = None
        self.pending = asyncio.Event()  # set when events wait for ``drain``: the publisher flushes then

    def start(self, ctx: zmq.asyncio.Context) -> None:
        from vllm.distributed.kv_events import KVEventBatch

        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.endpoint)
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._task = asyncio.get_running_loop().create_task(self._read(sock, decoder))

    async def _read(self, sock: zmq.asyncio.Socket, decoder: msgspec.msgpack.Decoder) -> None:
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    batch = decoder.decode(frames[-1])
                except msgspec.DecodeError as exc:
                    log.warning("vllm_kv_event_undecodable", error=str(exc))
                    continue
                for event in batch.events:
                    self.translate(event)
                if self._pending:
                    self.pending.set()
        finally:
            sock.close(linger=0)

    def translate(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "BlockStored":
            parent = None
            if event.parent_block_hash is not None:
                parent = self._ours.get(event.parent_block_hash)
                if parent is None:  # we missed the parent's event: these blocks cannot be named
                    self._num_unchained += 1
                    return
            seed = adapter_seed(self._seed, getattr(event, "lora_name", None) or "")
            ours = chain_block_hashes(event.token_ids, event.block_size, seed, parent)
            if len(ours) != len(event.block_hashes):
                log.warning("vllm_kv_event_mismatch", num_hashes=len(event.block_hashes), num_ours=len(ours))
                return
            self._ours.update(zip(event.block_hashes, ours))
            self._pending.append(BlockStored(block_hashes=tuple(ours), parent_hash=parent, tier="device"))
        elif kind == "BlockRemoved":
            gone = tuple(h for h in (self._ours.pop(v, None) for v in event.block_hashes) if h is not None)
            if gone:
                self._pending.append(BlockRemoved(block_hashes=gone, tier="device"))
        elif kind == "AllBlocksCleared":
            self._ours.clear()
            self._pending.append(AllCleared(tier="device"))

    def drain(self) -> list[KvEvent]:
        out, self._pending = self._pending, []
        return out

    def snapshot(self) -> tuple[int, ...]:
        return tuple(self._ours.values())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
