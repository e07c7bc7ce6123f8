"""`--mock-nixl`: the mock engine's KV as real bytes in a NIXL-registered host region, moved by real READs.

The mock computes no KV, but with this option each engine owns one host buffer of ``num_blocks`` x ``block_bytes``
(block ``b`` at ``base + b * block_bytes``), registered with its own NIXL agent (common/nixl.py: no progress thread,
UCX without error handling). A prefill engine fills each block of a finished prompt with ``fake_kv_payload`` of the
block's content key (``block_keys``), holds the blocks and hands out its agent's metadata in ``KvTransferParams``;
the decode engine adds that agent, READs the blocks (adjacent ones coalesced, ``runs``) with the request's hold id
as the notification, and checks every block against the keys it computes from the prompt itself. So a mock run
moves and verifies real bytes over whatever wire UCX picks (CMA on one host, TCP between network namespaces).

Every NIXL call of one engine runs on this module's one thread (sharing an agent between threads needs NIXL's
thread-sync modes; docs/architecture.md#nixl-facts): READs (polled to completion there) and the prefill side's
notification drain, which is also what progresses its UCX worker for peers reading over TCP.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import structlog

from common.hashing import block_hashes, chain_block_hashes
from common.nixl import NixlHandle, make_nixl_agent, run_xfer
from services.worker.engines.mock.payload import fake_kv_payload

log = structlog.get_logger(__name__)


def block_keys(token_ids: Sequence[int], block_size: int, seed: int) -> list[int]:
    """One content key per KV block of ``token_ids``: the chained block hash of each full block, and for a trailing
    partial block the chain continued over its tokens alone (a block of their length), so both ends derive the same
    bytes from the prompt, partial block included."""
    keys = block_hashes(token_ids, block_size, seed)
    num_rest = len(token_ids) - len(keys) * block_size
    if num_rest:
        tail = token_ids[len(keys) * block_size:]
        keys += chain_block_hashes(tail, num_rest, seed, keys[-1] if keys else None)
    return keys


def runs(local_ids: Sequence[int], remote_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(local start, remote start, num blocks) runs, each adjacent on both sides: one NIXL descriptor each."""
    if len(local_ids) != len(remote_ids):
        raise ValueError(f"{len(local_ids)} local blocks for {len(remote_ids)} remote ones")
    out: list[tuple[int, int, int]] = []
    for local, remote in zip(local_ids, remote_ids):
        if out and out[-1][0] + out[-1][2] == local and out[-1][1] + out[-1][2] == remote:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((local, remote, 1))
    return out


@dataclass(frozen=True, slots=True)
class ReadDone:
    seconds: float  # post to completion, as the initiator polled it
    num_bytes: int
    num_descriptors: int


class MockKvRegion:
    def __init__(self, engine_id: str, num_blocks: int, block_bytes: int, xfer_timeout_s: float = 10.0) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.block_bytes = block_bytes
        self.num_blocks = num_blocks
        self.xfer_timeout_s = xfer_timeout_s
        # np.zeros: pages cost memory only once a block is written.
        self.buf = np.zeros(num_blocks * block_bytes, dtype=np.uint8)
        # Unique per process and start: a restarted prefill worker's agent is never taken for its predecessor's.
        self.name = f"mock-{engine_id}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mock-nixl")
        self._nixl: NixlHandle | None = None
        self._reg = None
        self.metadata = b""
        self._remotes: dict[bytes, str] = {}  # peer agent metadata -> its name, added once

    @property
    def base_addr(self) -> int:
        return int(self.buf.ctypes.data)

    async def start(self) -> None:
        await self._run(self._start)
        log.info("mock_nixl_ready", agent=self.name, num_blocks=self.num_blocks, block_bytes=self.block_bytes,
                 mib=round(self.buf.nbytes / 2**20, 1))

    def _start(self) -> None:
        self._nixl = make_nixl_agent(self.name, backends=("UCX",), required=True)
        agent = self._nixl.agent
        self._reg = agent.register_memory([(self.base_addr, self.buf.nbytes, 0, "")], "DRAM")  # type: ignore[attr-defined]
        self.metadata = agent.get_agent_metadata()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------------------------- bytes

    def _block(self, block_id: int) -> np.ndarray:
        if not 0 <= block_id < self.num_blocks:
            raise IndexError(f"block {block_id} outside the region's {self.num_blocks}")
        return self.buf[block_id * self.block_bytes:(block_id + 1) * self.block_bytes]

    def fill(self, block_ids: Sequence[int], keys: Sequence[int]) -> None:
        """Block ``block_ids[i]`` := the bytes of content key ``keys[i]``."""
        for block_id, key in zip(block_ids, keys, strict=True):
            self._block(block_id)[:] = np.frombuffer(fake_kv_payload(key, self.block_bytes), dtype=np.uint8)

    def intact(self, block_ids: Sequence[int], keys: Sequence[int]) -> bool:
        """Every block holds exactly its key's bytes."""
        return all(np.array_equal(self._block(b), np.frombuffer(fake_kv_payload(k, self.block_bytes), np.uint8))
                   for b, k in zip(block_ids, keys, strict=True))

    # -------------------------------------------------------------------------------------------- NIXL

    async def read(self, metadata: bytes, base_addr: int, block_bytes: int, local_ids: Sequence[int],
                   remote_ids: Sequence[int], notif: str) -> ReadDone:
        """READ the peer's blocks ``remote_ids`` into ours ``local_ids``; the peer is notified ``notif`` when done.
        Raises on a refused descriptor, an ERR or a timeout."""
        if block_bytes != self.block_bytes:
            raise ValueError(f"the prefill engine's blocks are {block_bytes} bytes, ours {self.block_bytes}")
        for block_id in local_ids:
            self._block(block_id)  # bounds
        return await self._run(self._read, metadata, base_addr, local_ids, remote_ids, notif)

    def _read(self, metadata: bytes, base_addr: int, local_ids: Sequence[int], remote_ids: Sequence[int],
              notif: str) -> ReadDone:
        agent = self._agent()
        peer = self._remote(metadata)
        bb = self.block_bytes
        spans = runs(local_ids, remote_ids)
        local = agent.get_xfer_descs([(self.base_addr + lo * bb, n * bb, 0) for lo, _, n in spans], "DRAM")
        remote = agent.get_xfer_descs([(base_addr + ro * bb, n * bb, 0) for _, ro, n in spans], "DRAM")
        started = time.perf_counter()
        handle = agent.initialize_xfer("READ", local, remote, peer, notif.encode())
        run_xfer(agent, handle, self.xfer_timeout_s, f"READ of {len(local_ids)} mock KV blocks from {peer}")
        return ReadDone(time.perf_counter() - started, len(local_ids) * bb, len(spans))

    async def notify(self, metadata: bytes, notif: str) -> None:
        """Tell the peer ``notif`` without a transfer (a failed READ's blocks can go); best effort."""
        try:
            await self._run(lambda: self._agent().send_notif(self._remote(metadata), notif.encode()))
        except Exception as exc:  # the peer may be the reason the READ failed
            log.warning("mock_nixl_notify_failed", error=repr(exc))

    async def notifs(self) -> list[str]:
        """Notifications peers sent since the last call (hold ids whose READ is over)."""
        got = await self._run(lambda: self._agent().get_new_notifs())
        return [m.decode() for msgs in got.values() for m in msgs]

    def _remote(self, metadata: bytes) -> str:
        name = self._remotes.get(metadata)
        if name is None:
            name = self._agent().add_remote_agent(metadata)
            name = name.decode() if isinstance(name, bytes) else name
            self._remotes[metadata] = name
        return name

    def _agent(self):  # noqa: ANN202 (nixl._api.nixl_agent)
        if self._nixl is None:
            raise RuntimeError("mock NIXL region not started")
        return self._nixl.agent

    async def _run(self, fn, *args):  # noqa: ANN001, ANN202
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        if self._executor._shutdown:  # closed already (an engine shut down twice)
            return
        try:
            await self._run(self._close)
        finally:
            self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._nixl is None:
            return
        agent = self._nixl.agent
        for name in self._remotes.values():
            try:
                agent.remove_remote_agent(name)  # type: ignore[attr-defined]
            except Exception as exc:  # a peer already gone
                log.warning("nixl_remove_remote_failed", error=repr(exc))
        self._remotes.clear()
        if self._reg is not None:
            agent.deregister_memory(self._reg)  # type: ignore[attr-defined]
            self._reg = None
        self._nixl = None
