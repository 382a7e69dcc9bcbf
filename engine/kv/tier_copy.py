"""TierCopy: block copies between the device pool and the pinned host tier, off the compute stream.

On a GPU a spill (device -> host) or reload (host -> device) runs on a copy
stream of its own, so the host thread does not wait for it and the copy
overlaps with compute. Ordering is kept on the GPU, not by the host: the copy
stream first waits for the work queued before it (the block's last writes),
and the compute stream then waits for the copy before anything after it
(a kernel writing the freed device block, or attention reading the reloaded
one). Only a CPU read of host-tier memory (`host_readable`) waits on the host.
On a CPU both tiers are host memory and a copy is a plain copy.
"""

from __future__ import annotations

import torch


class TierCopy:
    def __init__(self, device: torch.device):
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._done: torch.cuda.Event | None = None

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst.copy_(src), asynchronous across tiers on a GPU; later GPU work sees the result."""
        if self._stream is None:
            dst.copy_(src)
            return
        compute = torch.cuda.current_stream(self._stream.device)
        self._stream.wait_stream(compute)  # the source's last writes come first
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)  # both are views of pools that live as long as the engine
        compute.wait_stream(self._stream)  # later kernels on the compute stream see the copy
        self._done = torch.cuda.Event()
        self._done.record(self._stream)

    def host_readable(self) -> None:
        """Wait until every copy issued so far has landed (before the CPU reads host-tier memory)."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
