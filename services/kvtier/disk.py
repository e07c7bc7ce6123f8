"""kvtier's NVMe tier: one slab file of fixed-size slots under a directory.

Slot ``i`` is bytes ``[i * block_bytes, ...)`` of ``<dir>/kvtier-<tier_id>.slab``; the file is created
sparse and truncated at start (the index is not persistent, so old contents mean nothing).

I/O goes through NIXL's POSIX backend when it works (DRAM<->FILE transfers: host-pool slot -> file on
demotion, file -> a registered staging buffer on reads), else plain ``os.pwrite``/``os.pread``. Measured
on this machine (nixl 1.5.1): the POSIX backend registers FILE descriptors and completes WRITE/READ
against the host pool, so ``io_mode`` is "nixl" by default; "os" is the fallback and a config choice.
Data is checked by the caller (checksums in the index), never trusted from disk.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog

from common.nixl import NixlHandle, run_xfer
from services.kvtier.pool import HostPool

log = structlog.get_logger(__name__)

IoMode = Literal["nixl", "os"]


def open_slab(path: Path) -> int:
    """A new slab file of our own at ``path``: never through a link, never someone else's file.

    O_EXCL|O_NOFOLLOW: a symlink or file planted at the path (by another local user, say) is not followed or
    truncated. A regular file of ours left by a crashed run is replaced; anything else is refused.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"refusing disk tier slab {path}: it exists and is not a regular file of ours") from None
        path.unlink()
        log.warning("disk_tier_stale_slab_replaced", path=str(path))
        return os.open(path, flags, 0o600)


class DiskTier:
    def __init__(self, directory: Path, tier_id: str, num_slots: int, block_bytes: int, pool: HostPool,
                 nixl: NixlHandle | None = None, prefer_nixl: bool = True,
                 xfer_timeout_s: float = 5.0) -> None:
        self.block_bytes = block_bytes
        self.num_slots = num_slots
        self.pool = pool
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = directory / f"kvtier-{tier_id}.slab"
        self._fd = open_slab(self.path)
        os.ftruncate(self._fd, num_slots * block_bytes)
        self._xfer_timeout_s = xfer_timeout_s
        self._nixl = nixl
        self._file_reg = None
        self._staging = np.zeros(block_bytes, dtype=np.uint8)
        self._staging_reg = None
        self.io_mode: IoMode = "os"
        self._prefer_nixl = prefer_nixl
        if nixl is not None:
            self.attach_nixl(nixl)
        log.info("disk_tier_ready", path=str(self.path), num_slots=num_slots, io_mode=self.io_mode)

    def attach_nixl(self, nixl: NixlHandle) -> None:
        """Move I/O to NIXL's POSIX backend if it is there and the host pool is registered."""
        if not (self._prefer_nixl and "POSIX" in nixl.backends and self.pool.registered and self.num_slots):
            return
        self._nixl = nixl
        agent = nixl.agent
        try:
            self._file_reg = agent.register_memory(  # type: ignore[attr-defined]
                [(0, self.num_slots * self.block_bytes, self._fd, "")], "FILE", backends=["POSIX"])
            self._staging_reg = agent.register_memory(  # type: ignore[attr-defined]
                [(int(self._staging.ctypes.data), self._staging.nbytes, 0, "")], "DRAM", backends=["POSIX"])
            self.io_mode = "nixl"
            log.info("disk_io", mode="nixl")
        except Exception as exc:
            log.warning("nixl_posix_unusable", error=repr(exc), fallback="os.pread/pwrite")
            self._release_nixl()
            self.io_mode = "os"

    # ------------------------------------------------------------------------------------------------ io

    def write_from_host(self, host_slot: int, disk_slot: int, size: int) -> None:
        """Copy a host-pool slot's first ``size`` bytes to a disk slot."""
        self._check(disk_slot, size)
        if self.io_mode == "nixl" and self._nixl_xfer("WRITE", host_slot, disk_slot, size):
            return
        os.pwrite(self._fd, self.pool.view(host_slot, size), disk_slot * self.block_bytes)

    def read(self, disk_slot: int, size: int) -> bytes:
        self._check(disk_slot, size)
        if self.io_mode == "nixl" and self._nixl_xfer("READ", None, disk_slot, size):
            return self._staging[:size].tobytes()
        return os.pread(self._fd, size, disk_slot * self.block_bytes)

    def read_into(self, disk_slot: int, host_slot: int, size: int) -> None:
        """Copy a disk slot's first ``size`` bytes into a host-pool slot (no Python bytes in between)."""
        self._check(disk_slot, size)
        if self.io_mode == "nixl" and self._nixl_xfer("READ", host_slot, disk_slot, size):
            return
        dest = self.pool.view(host_slot, size)
        if os.preadv(self._fd, [dest], disk_slot * self.block_bytes) != size:
            raise OSError(f"short read of disk slot {disk_slot}")

    def close(self) -> None:
        self._release_nixl()
        try:
            os.close(self._fd)
        except OSError:
            pass
        try:
            self.path.unlink()
        except OSError:
            pass

    # ---------------------------------------------------------------------------------------- internals

    def _nixl_xfer(self, op: str, host_slot: int | None, disk_slot: int, size: int) -> bool:
        """Move the bytes between a host slot (None: the staging buffer) and a disk slot with NIXL POSIX;
        False (and os I/O from now on) when NIXL fails."""
        try:
            assert self._nixl is not None
            agent: Any = self._nixl.agent
            dram_addr = int(self._staging.ctypes.data) if host_slot is None else self.pool.addr(host_slot)
            local = agent.get_xfer_descs([(dram_addr, size, 0)], "DRAM")
            remote = agent.get_xfer_descs([(disk_slot * self.block_bytes, size, self._fd)], "FILE")
            handle = agent.initialize_xfer(op, local, remote, self._nixl.name, b"", backends=["POSIX"])
            run_xfer(agent, handle, self._xfer_timeout_s, f"POSIX {op} of slot {disk_slot}")
        except Exception as exc:
            self._degrade(exc)
            return False
        return True

    def _degrade(self, exc: Exception) -> None:
        log.warning("nixl_posix_failed", error=repr(exc), fallback="os.pread/pwrite")
        self._release_nixl()
        self.io_mode = "os"

    def _release_nixl(self) -> None:
        if self._nixl is None:
            return
        for reg, backends in ((self._file_reg, ["POSIX"]), (self._staging_reg, ["POSIX"])):
            if reg is not None:
                try:
                    self._nixl.agent.deregister_memory(reg, backends=backends)  # type: ignore[attr-defined]
                except Exception:
                    pass
        self._file_reg = self._staging_reg = None

    def _check(self, slot: int, size: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"disk slot {slot} outside the tier's {self.num_slots}")
        if not 0 <= size <= self.block_bytes:
            raise ValueError(f"block of {size} bytes does not fit a {self.block_bytes}-byte slot")
