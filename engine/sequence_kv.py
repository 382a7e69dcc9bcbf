"""SequenceKV: one request's K/V, kept in pool blocks and in a contiguous working copy.

The pool blocks are the cache (shared prefix blocks plus the request's own);
attention reads the working copy, so the decode step runs exactly as it does
without a prefix cache. The cached prefix is gathered into the working copy
once when the request starts, except for the positions the working copy
already holds (the engine hands the last request's buffer to the next one,
which in a chat is the same conversation); each forward pass appends its new
positions to both (one slice per block touched, all layers at once).
"""

from __future__ import annotations

import torch

from engine.kv_cache import ContiguousKVCache, KVCache
from engine.prefix_cache import Match, PrefixCache


class SequenceKV(KVCache):
    def __init__(self, cache: PrefixCache, working: ContiguousKVCache, match: Match):
        """`working` must hold no position beyond match.cached_tokens, and only correct ones."""
        self.cache = cache
        self.working = working
        self.blocks = list(match.blocks)
        self.owned = set(match.owned)
        self.shared = match.shared
        self.closed = False
        working.fill(match.cached_tokens, lambda start, end, k, v: cache.pool.load(self.blocks, start, end, k, v))

    @property
    def num_tokens(self) -> int:
        return self.working.num_tokens

    def reserve(self, new_tokens: int) -> None:
        self.working.reserve(new_tokens)
        size = self.cache.block_size
        missing = -(-(self.num_tokens + new_tokens) // size) - len(self.blocks)
        if missing > 0:
            fresh = self.cache.allocate(missing)
            self.blocks += fresh
            self.owned.update(fresh)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.working.write(layer, k, v)

    def commit(self, new_tokens: int) -> None:
        start = self.num_tokens
        self.working.commit(new_tokens)
        self.cache.pool.store(self.blocks, start, *self.working.positions(start, start + new_tokens))

    def close(self, tokens: list[int] | None) -> None:
        """Hand the blocks to the cache: `tokens` (the ids whose K/V are stored) are cached; None caches nothing."""
        if self.closed:
            return
        self.closed = True
        if tokens is None:
            self.cache.release(self.owned, self.shared)
        else:
            self.cache.insert(tokens[: self.num_tokens], self.blocks, self.owned, self.shared)
