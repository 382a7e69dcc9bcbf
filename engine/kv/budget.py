"""How much memory the KV cache may take when the user does not say (`--kv-cache-gb`)."""

from __future__ import annotations

import os

import torch

from engine.config.hybrid import HybridLayers
from engine.errors import EngineError, ModelError
from engine.recurrent.state import SequenceState

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


def available_ram_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable: what can be used without swapping (page cache counted as reclaimable); None where the
    system does not say (no /proc/meminfo)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_ram(model_bytes: int, pool_bytes: int, model_name: str) -> None:
    """ModelError (one sentence, with the numbers) if the model file and the K/V kept in RAM cannot both fit
    in the RAM available now: said before anything is read, not as an out-of-memory kill halfway."""
    available = available_ram_bytes()
    if available is None or model_bytes + pool_bytes <= available:
        return
    raise ModelError(f"{model_name} needs {model_bytes / GIB:.1f} GiB for its weights and {pool_bytes / GIB:.1f} GiB "
                     f"for the K/V cache, but only {available / GIB:.1f} GiB of RAM is available; close other "
                     "programs, pick a smaller model or lower --kv-cache-gb.")


CHECKPOINTS_AT_LEAST = 16  # state checkpoints a hybrid model's cache always has room for (two a chat turn)


def checkpoint_budget(hybrid: HybridLayers | None, pool_bytes: int, dtype: torch.dtype) -> int | None:
    """Bytes of state checkpoints a hybrid model's prefix cache keeps (kv/checkpoints.py); None for an
    attention-only model. Half the K/V pool's bytes, and never fewer than CHECKPOINTS_AT_LEAST checkpoints:
    a checkpoint of Qwen3.5-0.8B is ~19 MB (its DeltaNet layers' fp32 matrices), ~770 tokens of its K/V."""
    if hybrid is None:
        return None
    one = SequenceState.zeros(hybrid, torch.device("meta"), dtype).nbytes
    return max(pool_bytes // 2, CHECKPOINTS_AT_LEAST * one)
