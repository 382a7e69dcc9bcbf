"""PagedKV: pool blocks read in place (the GPU default): nothing is copied when a request starts.

New K/V go straight into their blocks. A single decode token attends over the blocks in place (paged
decode attention, attention/paged.py, also what the captured decode step runs, decode/graph_runner.py);
a prefill chunk attends over a gathered copy of its context through SDPA (attention/dense.py).
"""

from __future__ import annotations

import torch

from engine.attention.dense import attend
from engine.attention.paged import paged_decode_attention
from engine.kv.pool import KVPool
from engine.kv.pooled import PooledKV
from engine.kv.prefix_cache import PrefixCache


def attend_in_place(pool: KVPool, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    slot_blocks: torch.Tensor, slot_offsets: torch.Tensor, table: torch.Tensor,
                    seq_len: torch.Tensor, scale: float, window: int | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One decode token of each of B sequences: write their k/v [kv_heads, B, head_dim] at (slot_blocks,
    slot_offsets) [B], then attend q [B, heads, head_dim], row b over its blocks `table[b]` ([B, width])
    up to `seq_len[b]` (a sliding-window layer: its last `window` positions). Tensors only, no host
    sync: the captured decode step runs this too."""
    pool.write_slots(layer, slot_blocks, slot_offsets, k.transpose(0, 1), v.transpose(0, 1))
    k_cache, v_cache = pool.layer_view(layer)
    return paged_decode_attention(q, k_cache, v_cache, table, seq_len, scale, window, sinks).reshape(q.shape[0], -1)


class PagedKV(PooledKV):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._slots: tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def open(cls, cache: PrefixCache, prompt_ids: list[int], use_prefix_cache: bool) -> tuple["PagedKV", str]:
        match = cache.match(prompt_ids if use_prefix_cache else [])
        return cls(cache, match, prompt_ids, use_prefix_cache), match.source

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        pool, new = self.cache.pool, k.shape[1]
        end = self.num_tokens + new
        blocks, offsets, table = self._slot_tensors(new, q.device)
        if new == 1:
            seq_len = torch.full((1,), end, dtype=torch.int32, device=q.device)
            return attend_in_place(pool, layer, q, k, v, blocks, offsets, table[None], seq_len, scale, window, sinks)
        pool.write_slots(layer, blocks, offsets, k.transpose(0, 1), v.transpose(0, 1))
        return attend(q, *pool.gather_layer(layer, table, end), mask, scale, window, sinks)

    def _slot_tensors(self, new: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where this forward pass's new positions go (block, offset) and the block table, made once per pass."""
        if self._slots is None or self._slots[0] != self.num_tokens:
            size, start = self.cache.block_size, self.num_tokens
            positions = torch.arange(start, start + new)
            table = torch.tensor(self.blocks[: -(-(start + new) // size)], dtype=torch.int32)
            slots = (table[positions // size].long(), positions % size, table)
            self._slots = (start, *(t.to(device, non_blocking=True) for t in slots))
        return self._slots[1:]

    def _truncate(self, num_tokens: int) -> None:
        super()._truncate(num_tokens)
        self._slots = None
