"""Packed tier blocks between the KV cache's device and host memory: one module whose device is a parameter.

kvtier holds blocks in host memory (its pool, its disk), and its wire carries bytes; vLLM's KV cache is on the
engine's device. ``TierMover(device)`` moves ``[n, block_bytes]`` uint8 tensors (``KvLayout.pack``'s output,
``KvLayout.unpack``'s input) between the two:

* CUDA: through pinned (page-locked) host buffers, on a side stream of the mover's own, so the copy runs
  beside the engine's kernels instead of in their queue. ``to_host`` starts the device -> host copy after the
  work already queued on the engine's stream (the pack) and returns at once with a ``HostCopy`` whose ``done``
  / ``wait`` tell when the bytes are there (the connector's save thread waits, not the engine step).
  ``to_device`` starts the host -> device copy and makes the engine's stream wait for it on the GPU (the CPU
  does not block), so the unpack and the forward queued after it see the bytes.
* CPU: the KV cache is host memory already: ``to_host`` hands the packed tensor back (pack made it a copy),
  ``to_device`` hands the host tensor back; both are done at once. The CPU tests run this same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class HostCopy:
    """Blocks on their way to host memory: ``tensor`` holds them once ``done()``."""

    tensor: torch.Tensor
    event: Any = None  # torch.cuda.Event recorded after the copy on the side stream; None: done already

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.tensor


class TierMover:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        # The side stream: copies here overlap the engine's kernels on its own stream.
        self._stream = torch.cuda.Stream(device=self.device) if self.on_cuda else None

    def to_host(self, blocks: torch.Tensor) -> HostCopy:
        """``blocks`` (on this mover's device) into host memory (pinned on CUDA); returns without waiting."""
        if not self.on_cuda:
            return HostCopy(blocks if blocks.device.type == "cpu" else blocks.cpu())
        assert self._stream is not None
        host = torch.empty(blocks.shape, dtype=blocks.dtype, pin_memory=True)
        # After what the engine queued so far (the pack that made ``blocks``), beside what it queues next.
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            host.copy_(blocks, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        # ``blocks`` belongs to the engine's stream: its memory must not be reused before the side copy ends.
        blocks.record_stream(self._stream)
        return HostCopy(host, event)

    def stage(self, blocks: Sequence[bytes | memoryview], block_bytes: int) -> torch.Tensor:
        """Fetched blocks' bytes as one ``[n, block_bytes]`` host tensor (pinned on CUDA), each copied once into
        its row: joining them, then pinning the join, cost two more copies (on an H200 host, a load of 64 blocks of
        36 layers ran at 4 GB/s that way, the pinned copy at 50)."""
        out = torch.empty((len(blocks), block_bytes), dtype=torch.uint8, pin_memory=self.on_cuda)
        rows = out.numpy()
        for i, block in enumerate(blocks):
            rows[i] = np.frombuffer(block, dtype=np.uint8)
        return out

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` blocks on this mover's device; on CUDA the engine's stream waits for them (on the GPU)."""
        if not self.on_cuda:
            return host
        assert self._stream is not None
        if not host.is_pinned():
            # A pageable source would make the copy synchronous (and staged by the driver): pin it first.
            host = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)
        current = torch.cuda.current_stream(self.device)
        out = torch.empty(host.shape, dtype=host.dtype, device=self.device)  # the engine stream's memory
        self._stream.wait_stream(current)  # ``out`` may reuse memory the engine's queued kernels still read
        with torch.cuda.stream(self._stream):
            out.copy_(host, non_blocking=True)
        out.record_stream(self._stream)
        current.wait_stream(self._stream)
        return out

    def synchronize(self) -> None:
        """Every copy started so far is finished (shutdown)."""
        if self._stream is not None:
            self._stream.synchronize()
