"""What every per-architecture test does to a model: random token ids, a fresh fp32 cache on the CPU, and the
logits at every position of a prompt run from scratch."""

from __future__ import annotations

import torch

from engine.kv.cache import ContiguousKVCache
from engine.recurrent.state import SequenceState
from tests.tiny_models import VOCAB

ATOL = 1e-4  # logits against transformers' (fp32): summation order apart, they agree to this
CPU = torch.device("cpu")


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def new_cache(model) -> ContiguousKVCache:
    """An empty cache for `model`: K/V of every layer, or of a hybrid model's attention layers with the state of
    its recurrent ones (zeros)."""
    cfg = model.cfg
    state = SequenceState.zeros(cfg.hybrid, CPU, torch.float32) if cfg.hybrid is not None else None
    return ContiguousKVCache(cfg.kv_layers, cfg.num_kv_heads, cfg.head_dim, cfg.context_window, CPU, torch.float32,
                             state=state)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    """[len(ids), vocab]: every position's logits, from an empty cache."""
    return model(ids, new_cache(model), all_logits=True)
