"""How much memory the KV cache may take when the user does not say (`--kv-cache-gb`)."""

from __future__ import annotations

import os

import torch

from engine.errors import EngineError

GIB = 2**30
CPU_POOL_MAX = 2 * GIB  # ~45k tokens of SmolLM2-135M in fp32: several full 8k-token conversations
HOST_TIER_MAX = 4 * GIB
CUDA_FREE_FRACTION = 0.8  # of the memory free after the weights; the rest is for activations


def total_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def _explicit(gb: float, flag: str) -> int:
    if gb < 0:
        raise EngineError(f"{flag} must not be negative.")
    return int(gb * GIB)


def kv_pool_bytes(gb: float | None, device: torch.device) -> int:
    """Device KV pool: as asked, else 80% of free GPU memory, else min(2 GiB, a quarter of RAM)."""
    if gb is not None:
        return _explicit(gb, "--kv-cache-gb")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_FREE_FRACTION)
    return min(CPU_POOL_MAX, total_ram_bytes() // 4)


def host_tier_bytes(gb: float | None, device: torch.device) -> int:
    """Host tier behind a GPU pool: as asked, else min(4 GiB, a quarter of RAM); none on a CPU."""
    if gb is not None:
        return _explicit(gb, "--host-cache-gb")
    if device.type == "cuda":
        return min(HOST_TIER_MAX, total_ram_bytes() // 4)
    return 0  # on a CPU the pool already lives in host memory
