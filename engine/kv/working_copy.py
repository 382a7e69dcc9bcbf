"""WorkingCopyKV: pool blocks read through a contiguous working copy (the CPU default).

Attention reads the copy, so a decode step runs exactly as it does without a prefix cache; on a CPU
this is faster than reading blocks in place. The cached prefix is gathered into the copy once when the
request starts, except for the positions it already holds (SpareBuffers hand the last request's
copy to the next, which in a chat is the same conversation). Each forward pass appends its new
positions to the copy; the pool gets them a block at a time (one slice, all layers at once), when the
block is full of final positions and joins the prefix cache's tree, and the last partial block at close:
only the tree's blocks are ever read back, and a store per token cost ~15 us alone and 0.25-0.62 ms a call
in a busy server (its first writes of fresh pool memory included). A request that does not publish never
writes the pool.
"""

from __future__ import annotations

import torch

from engine.kv.cache import ContiguousKVCache
from engine.kv.pooled import PooledKV
from engine.kv.prefix_cache import Match, PrefixCache
from engine.kv.spare_buffers import SpareBuffers


class WorkingCopyKV(PooledKV):
    def __init__(self, cache: PrefixCache, working: ContiguousKVCache, match: Match, prompt_ids: list[int],
                 publish: bool, spare: SpareBuffers | None = None):
        """`working` must hold no position beyond match.cached_tokens, and only correct ones.
        `spare`: where the copy goes at close, for the next request (None: it is dropped)."""
        super().__init__(cache, match, prompt_ids, publish)
        self.working, self._spare = working, spare
        self._stored = match.cached_tokens  # positions the pool's blocks hold
        working.fill(match.cached_tokens, lambda start, end, k, v: cache.pool.read_into(self.blocks, start, end, k, v))
        state = working.state
        if state is not None and state.position != match.cached_tokens:  # not the spare's own state: load it
            if match.state is not None:
                state.load(match.state)
            else:  # a hybrid match without a checkpoint is empty
                state.reset()

    @classmethod
    def open(cls, cache: PrefixCache, spare: SpareBuffers, prompt_ids: list[int],
             use_prefix_cache: bool) -> tuple["WorkingCopyKV", str]:
        working, _ = spare.take(prompt_ids)
        match = cache.match(prompt_ids if use_prefix_cache else [])
        working.truncate(match.cached_tokens)  # without the prefix cache the match is empty: from scratch
        return cls(cache, working, match, prompt_ids, use_prefix_cache, spare), match.source

    @property
    def contiguous(self) -> ContiguousKVCache:
        return self.working

    def reserve(self, new_tokens: int) -> None:
        self.working.reserve(new_tokens)
        super().reserve(new_tokens)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        return self.working.attention(layer, q, k, v, mask, scale, window, sinks)

    def commit(self, new_tokens: int) -> None:
        super().commit(new_tokens)
        self.working.commit(new_tokens)

    def _finalized(self) -> None:
        if self.publish:  # the full blocks about to join the tree
            size = self.cache.block_size
            self._store(self.num_final // size * size)
        super()._finalized()

    def _store(self, end: int) -> None:
        """Write positions up to `end` (final ones) from the copy into the pool's blocks."""
        if end > self._stored:
            self.cache.pool.store(self.blocks, self._stored, *self.working.positions(self._stored, end))
            self._stored = end

    def _truncate(self, num_tokens: int) -> None:
        super()._truncate(num_tokens)
        self.working.truncate(num_tokens)
        self._stored = min(self._stored, num_tokens)

    def _close(self) -> None:
        if self.publish:  # the last partial block joins the tree now
            self._store(self.num_final)
        super()._close()
        # The copy's positions past the final ones hold K/V of tokens nobody named: not reusable.
        self.working.truncate(self.num_final)
        if self._spare is not None:
            self._spare.give(self.working, self.final_tokens if self.publish else [])
