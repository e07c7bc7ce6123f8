"""kvtier's host pool: one contiguous uint8 buffer of fixed-size slots, registered with a NIXL agent.

Slot ``i`` is bytes ``[i * block_bytes, (i + 1) * block_bytes)`` of the buffer; a block of ``size`` bytes
uses the slot's first ``size`` bytes. The buffer is allocated with ``np.zeros`` (untouched pages cost no
memory until written). The slot allocator lives in ``index.TierIndex``; this class only holds the memory.

NIXL (docs/architecture.md#nixl-facts): ``nixl_agent_config(enable_prog_thread=False, backends=[])``, then the UCX backend with
``ucx_error_handling_mode=none`` (peers reading the pool) and the POSIX backend (DRAM<->FILE for the disk
tier). The whole buffer is registered once, so a later NIXL data path can hand out
``(base_addr + slot * block_bytes, size)`` descriptors without registering per block. If the agent cannot
be made, the pool works unregistered (inline bytes only) and says so in the log.
"""

from __future__ import annotations

import os

import numpy as np
import structlog

from common.nixl import NixlHandle

log = structlog.get_logger(__name__)

GIB = 1024**3


class HostPool:
    def __init__(self, num_bytes: int, block_bytes: int, nixl: NixlHandle | None = None,
                 num_bounce: int = 0) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.block_bytes = block_bytes
        self.num_slots = max(0, num_bytes // block_bytes)
        # Bounce slots after the index's slots (``num_slots .. total_slots - 1``), never in the index: disk blocks
        # are read into them for a worker to READ with NIXL. Same buffer, so the same registration covers them.
        self.num_bounce = num_bounce if self.num_slots else 0
        self.total_slots = self.num_slots + self.num_bounce
        self.buf = np.zeros(self.total_slots * block_bytes, dtype=np.uint8)
        self.nixl: NixlHandle | None = None
        self._reg = None
        if nixl is not None:
            self.attach_nixl(nixl)
        log.info("host_pool_ready", num_slots=self.num_slots, block_bytes=block_bytes,
                 gib=round(self.buf.nbytes / GIB, 3), nixl_registered=self.registered)

    def attach_nixl(self, nixl: NixlHandle) -> bool:
        """Register the whole buffer with ``nixl``'s agent (every backend that takes DRAM)."""
        self.nixl = nixl
        if not self.num_slots:
            return False
        try:
            self._reg = nixl.agent.register_memory(  # type: ignore[attr-defined]
                [(self.base_addr, self.buf.nbytes, 0, "")], "DRAM")
        except Exception as exc:
            log.warning("nixl_register_failed", what="host pool", error=repr(exc))
            self._reg = None
        return self._reg is not None

    @property
    def registered(self) -> bool:
        return self._reg is not None

    @property
    def base_addr(self) -> int:
        return int(self.buf.ctypes.data)

    def addr(self, slot: int) -> int:
        """Address of a slot (for NIXL descriptors)."""
        self._check(slot)
        return self.base_addr + slot * self.block_bytes

    def view(self, slot: int, size: int) -> memoryview:
        """The slot's first ``size`` bytes, without copying."""
        self._check(slot, size)
        start = slot * self.block_bytes
        return memoryview(self.buf[start:start + size])

    def write(self, slot: int, data: bytes | memoryview) -> None:
        size = len(data)
        self._check(slot, size)
        start = slot * self.block_bytes
        self.buf[start:start + size] = np.frombuffer(data, dtype=np.uint8)

    def read(self, slot: int, size: int) -> bytes:
        return bytes(self.view(slot, size))

    def close(self) -> None:
        if self._reg is not None and self.nixl is not None:
            try:
                self.nixl.agent.deregister_memory(self._reg)  # type: ignore[attr-defined]
            except Exception as exc:
                log.warning("nixl_deregister_failed", error=repr(exc))
            self._reg = None

    def _check(self, slot: int, size: int = 0) -> None:
        if not 0 <= slot < self.total_slots:
            raise IndexError(f"slot {slot} outside the pool's {self.total_slots}")
        if not 0 <= size <= self.block_bytes:
            raise ValueError(f"block of {size} bytes does not fit a {self.block_bytes}-byte slot")


def agent_name(tier_id: str) -> str:
    return f"kvtier-{tier_id}-{os.getpid()}"
