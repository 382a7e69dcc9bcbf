"""SequenceKV: one request's K/V, kept in pool blocks (and, on a CPU, in a contiguous working copy).

The pool blocks are the cache (shared prefix blocks plus the request's own),
and each block a forward pass completes joins the prefix cache's tree at once.
Attention reads them one of two ways:

- with a working copy (the CPU default): attention reads the copy, so the
  decode step runs exactly as it does without a prefix cache. The cached
  prefix is gathered into it once when the request starts, except for the
  positions it already holds (the engine hands the last request's buffer to
  the next one, which in a chat is the same conversation); each forward pass
  appends its new positions to both (one slice per block touched, all layers
  at once). On a CPU this is faster than reading blocks in place.
- paged (`working=None`, the GPU path): new K/V go straight into their
  blocks; a single decode token attends over the blocks in place (paged
  decode attention), and a prefill chunk attends over a gathered copy of
  its context through SDPA. Nothing is copied when the request starts.
"""

from __future__ import annotations

import torch

from engine.model.attention import attend
from engine.kv.cache import ContiguousKVCache, KVCache
from engine.decode.paged_attention import paged_decode_attention
from engine.kv.prefix_cache import Match, Node, PrefixCache


class SequenceKV(KVCache):
    def __init__(self, cache: PrefixCache, working: ContiguousKVCache | None, match: Match,
                 prompt_ids: list[int], publish: bool = True):
        """`working` must hold no position beyond match.cached_tokens, and only correct ones;
        None: paged (attention reads the blocks).

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
        self._length = match.cached_tokens
        self._slots: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if working is not None:
            working.fill(match.cached_tokens, lambda start, end, k, v: cache.pool.load(self.blocks, start, end, k, v))

    @property
    def num_tokens(self) -> int:
        return self._length

    def reserve(self, new_tokens: int) -> None:
        if self.working is not None:
            self.working.reserve(new_tokens)
        size = self.cache.block_size
        missing = -(-(self.num_tokens + new_tokens) // size) - len(self.blocks)
        if missing > 0:
            fresh = self.cache.allocate(missing)
            self.blocks += fresh
            self.owned.update(fresh)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.working is None:
            raise TypeError("a paged sequence has no contiguous K/V to write; use attention()")
        return self.working.write(layer, k, v)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        if self.working is not None:
            return super().attention(layer, q, k, v, mask, scale)
        pool, new = self.cache.pool, k.shape[1]
        end = self._length + new
        blocks, offsets, table = self._slot_tensors(new, q.device)
        pool.write_slots(layer, blocks, offsets, k.transpose(0, 1), v.transpose(0, 1))
        if new == 1:
            seq_len = torch.full((1,), end, dtype=torch.int32, device=q.device)
            k_cache, v_cache = pool.layer_view(layer)
            out = paged_decode_attention(q, k_cache, v_cache, table[None], seq_len, scale)
            return out.reshape(1, -1)
        return attend(q, *pool.gather_layer(layer, table, end), mask, scale)

    def _slot_tensors(self, new: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where this forward pass's new positions go (block, offset) and the block table, made once per pass."""
        if self._slots is None or self._slots[0] != self._length:
            size, start = self.cache.block_size, self._length
            positions = torch.arange(start, start + new)
            table = torch.tensor(self.blocks[: -(-(start + new) // size)], dtype=torch.int32)
            slots = (table[positions // size].long(), positions % size, table)
            self._slots = (start, *(t.to(device, non_blocking=True) for t in slots))
        return self._slots[1:]

    def commit(self, new_tokens: int) -> None:
        start = self._length
        self._length += new_tokens
        if self.working is not None:
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
