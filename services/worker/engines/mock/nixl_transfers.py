"""The mock engine's side of `--mock-nixl`: prefill blocks held for the decode engine, and pulls of real bytes.

Prefill (``hold``): a finished prompt's blocks are filled with their content keys' bytes and pinned in the block
manager under a hold id until the decode engine's READ notification names it, or ``hold_s`` passes (a decode
worker that died or was cut off never notifies; vLLM's NixlConnector frees its blocks on a timeout the same way).
Decode (``pull``): the load's blocks are pinned for the READ (an abort mid-READ must not hand them to another
sequence while bytes still land), READ from the prefill engine's region and checked block by block against the
keys of the prompt. False means not intact (refused descriptor, NIXL error, timeout, a wrong byte): the engine
frees them and recomputes. A READ that completed notifies the prefill engine by itself; a failed one sends the
notification explicitly, so the prefill side frees at once when the peer still answers.

Transfers are recorded real (``TransferLog(simulated=False)``): bytes moved, READ seconds, descriptors; the
router learns the link from them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from common.protocol import KvTransferParams
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.nixl_kv import MockKvRegion, block_keys
from services.worker.transfer_log import TransferLog

log = structlog.get_logger(__name__)

# Seconds between notification drains while blocks are held (the drain also progresses UCX for TCP readers).
_POLL_S = 0.001


class NixlTransfers:
    def __init__(self, engine_id: str, blocks: BlockManager, block_bytes: int, transfers: TransferLog,
                 hold_s: float = 30.0, xfer_timeout_s: float = 10.0) -> None:
        self.region = MockKvRegion(engine_id, blocks.num_blocks, block_bytes, xfer_timeout_s)
        self._blocks = blocks
        self._transfers = transfers
        self.hold_s = hold_s
        self._held: dict[str, tuple[tuple[int, ...], float]] = {}  # hold id -> (block ids, monotonic deadline)
        self._num_holds = 0
        self._held_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pulls: dict[str, asyncio.Task[None]] = {}  # request id -> its pull, until done
        self.num_failures = 0
        self.num_expired = 0

    @property
    def num_held_blocks(self) -> int:
        return sum(len(ids) for ids, _ in self._held.values())

    async def start(self) -> None:
        await self.region.start()
        self._task = asyncio.get_running_loop().create_task(self._serve_holds(), name="mock-nixl-holds")

    # -------------------------------------------------------------------------------------------- prefill

    def hold(self, request_id: str, token_ids: Sequence[int], block_ids: Sequence[int],
             transfer: KvTransferParams) -> KvTransferParams:
        """Fill and hold a finished prompt's blocks; ``transfer`` with what the decode engine needs to READ them."""
        keys = block_keys(token_ids, self._blocks.block_size, self._blocks.hash_seed)
        if len(keys) != len(block_ids):
            raise ValueError(f"{len(token_ids)} prompt tokens in {len(block_ids)} blocks")
        self.region.fill(block_ids, keys)
        self._blocks.pin(block_ids)
        self._num_holds += 1
        hold_id = f"{request_id}#{self._num_holds}"
        self._held[hold_id] = (tuple(block_ids), time.monotonic() + self.hold_s)
        self._held_changed.set()
        r = self.region
        return KvTransferParams(
            remote_engine_id=transfer.remote_engine_id, remote_block_ids=tuple(block_ids), mode=transfer.mode,
            remote_request_id=hold_id, num_bytes=len(block_ids) * r.block_bytes, nixl_metadata=r.metadata,
            nixl_base_addr=r.base_addr, nixl_block_bytes=r.block_bytes)

    def release(self, hold_id: str) -> bool:
        held = self._held.pop(hold_id, None)
        if held is None:
            return False  # expired already, or a duplicate notification
        self._blocks.unpin(held[0])
        return True

    def release_request(self, request_id: str) -> int:
        """Release what ``request_id``'s finished prefill holds (its decode will not come); how many holds."""
        return sum(self.release(h) for h in [h for h in self._held if h.rpartition("#")[0] == request_id])

    async def _serve_holds(self) -> None:
        while True:
            if not self._held:
                self._held_changed.clear()
                await self._held_changed.wait()
                continue
            for hold_id in await self.region.notifs():
                self.release(hold_id)
            now = time.monotonic()
            for hold_id in [h for h, (_, deadline) in self._held.items() if deadline < now]:
                self.num_expired += 1
                log.warning("mock_nixl_hold_expired", hold_id=hold_id, hold_s=self.hold_s)
                self.release(hold_id)
            await asyncio.sleep(_POLL_S)

    # --------------------------------------------------------------------------------------------- decode

    def start_pull(self, seq_id: str, prompt_ids: Sequence[int], block_ids: Sequence[int], num_load_tokens: int,
                   kv: KvTransferParams, done: Callable[[str, bool], None]) -> None:
        """``pull`` as a task; ``done(seq_id, intact)`` when it ends (an engine's failure in it is logged: the
        sequence is then recomputed)."""
        async def run() -> None:
            ok = False
            try:
                ok = await self.pull(prompt_ids, block_ids, num_load_tokens, kv)
            except Exception:
                log.exception("mock_nixl_pull_crashed", request_id=seq_id)
            finally:
                if self._pulls.get(seq_id) is asyncio.current_task():
                    del self._pulls[seq_id]
            done(seq_id, ok)

        self._pulls[seq_id] = asyncio.get_running_loop().create_task(run(), name=f"mock-nixl-pull-{seq_id}")

    async def pull(self, prompt_ids: Sequence[int], block_ids: Sequence[int], num_load_tokens: int,
                   kv: KvTransferParams) -> bool:
        """READ the last ``num_load_tokens`` tokens' blocks of ``prompt_ids`` into ``block_ids`` (the sequence's
        table; leading ones cached here are skipped) and check them. True: intact and recorded."""
        block_size = self._blocks.block_size
        skip = (len(prompt_ids) - num_load_tokens) // block_size
        local = tuple(block_ids[skip:])
        remote = tuple(kv.remote_block_ids[skip:])
        if not kv.nixl_metadata or len(kv.remote_block_ids) != len(block_ids):
            self.num_failures += 1
            log.warning("mock_nixl_pull_refused", remote_engine_id=kv.remote_engine_id,
                        reason="no NIXL region named (start the prefill worker with --mock-nixl)"
                        if not kv.nixl_metadata else f"{len(kv.remote_block_ids)} remote blocks for {len(block_ids)}")
            return False
        keys = block_keys(prompt_ids, block_size, self._blocks.hash_seed)[skip:]
        self._blocks.pin(local)
        ok = False
        try:
            done = await self.region.read(kv.nixl_metadata, kv.nixl_base_addr, kv.nixl_block_bytes, local, remote,
                                          kv.remote_request_id)
            ok = self.region.intact(local, keys)
            if ok:
                self._transfers.record(done.seconds, done.num_bytes, done.num_descriptors,
                                       src_worker_id=kv.remote_engine_id)
            else:
                log.warning("mock_nixl_pull_corrupt", remote_engine_id=kv.remote_engine_id, num_blocks=len(local))
        except Exception as exc:
            log.warning("mock_nixl_pull_failed", remote_engine_id=kv.remote_engine_id, error=repr(exc))
            await self.region.notify(kv.nixl_metadata, kv.remote_request_id)
        finally:
            self._blocks.unpin(local)
        if not ok:
            self.num_failures += 1
        return ok

    async def close(self) -> None:
        pulls, self._pulls = list(self._pulls.values()), {}
        for pull in pulls:
            pull.cancel()
        await asyncio.gather(*pulls, return_exceptions=True)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for hold_id in list(self._held):
            self.release(hold_id)
        await self.region.close()
