"""SequenceKV: one request's K/V, kept in pool blocks and in a contiguous working copy.

The pool blocks are the cache (shared prefix blocks plus the request's own);
attention reads the working copy, so the decode step runs exactly as it does
without a prefix cache. The cached prefix is gathered into the working copy
once when the request starts, except for the positions the working copy
already holds (the engine hands the last request's buffer to the next one,
which in a chat is the same conversation); each forward pass appends its new
positions to both (one slice per block touched, all layers at once), and
each block it completes joins the prefix cache's tree at once.
"""

from __future__ import annotations

import torch

from engine.kv_cache import ContiguousKVCache, KVCache
from engine.prefix_cache import Match, Node, PrefixCache


class SequenceKV(KVCache):
    def __init__(self, cache: PrefixCache, working: ContiguousKVCache, match: Match, prompt_ids: list[int],
                 publish: bool = True):
        """`working` must hold no position beyond match.cached_tokens, and only correct ones.

        `publish`: file completed blocks in the tree (False: the request leaves nothing behind).
        """
        self.cache = cache
        self.working = working
        self.blocks = list(match.blocks)
        self.owned = set(match.owned)
        self.chain: list[Node] = list(match.shared)  # referenced nodes of this sequence's full blocks
        self.tokens = list(prompt_ids[: match.cached_tokens])  # ids of the positions with K/V
        self.publish = publish
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

    def committed(self, token_ids: list[int]) -> None:
        """Name the tokens of the positions the last forward pass committed; completed blocks join the tree."""
        self.tokens += token_ids
        if not self.publish:
            return
        size, root = self.cache.block_size, self.cache.root
        while (len(self.chain) + 1) * size <= len(self.tokens):
            index = len(self.chain)
            piece = tuple(self.tokens[index * size : (index + 1) * size])
            node = self.cache.adopt(self.chain[-1] if self.chain else root, piece, self.blocks[index], self.owned)
            self.blocks[index] = node.block
            self.chain.append(node)

    def close(self) -> None:
        """Give everything back to the cache: the last partial block joins the tree if publishing."""
        if self.closed:
            return
        self.closed = True
        if not self.publish:
            self.cache.release(self.owned, self.chain)
            return
        start = len(self.chain) * self.cache.block_size
        tail = tuple(self.tokens[start:])
        self.cache.finish(self.chain, tail, self.blocks[len(self.chain)] if tail else None, self.owned)
