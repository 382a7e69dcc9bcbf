"""ContiguousKV: a request's K/V in one buffer of its own, with no prefix cache (`--no-prefix-cache`).

Nothing is shared, so finalising only counts; the buffer goes to SpareBuffers at close, holding no
reusable positions (nothing told it which prefix the next request shares).
"""

from __future__ import annotations

import torch

from engine.kv.cache import ContiguousKVCache
from engine.kv.sequence import SequenceKV
from engine.kv.spare_buffers import SpareBuffers


class ContiguousKV(SequenceKV):
    def __init__(self, buffer: ContiguousKVCache, spare: SpareBuffers):
        super().__init__([])
        self.buffer, self._spare = buffer, spare

    @classmethod
    def open(cls, spare: SpareBuffers, prompt_ids: list[int]) -> tuple["ContiguousKV", str]:
        buffer, _ = spare.take(prompt_ids)
        buffer.truncate(0)
        return cls(buffer, spare), "none"

    @property
    def num_tokens(self) -> int:
        return self.buffer.num_tokens

    @property
    def contiguous(self) -> ContiguousKVCache:
        return self.buffer

    def reserve(self, new_tokens: int) -> None:
        self.buffer.reserve(new_tokens)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        return self.buffer.attention(layer, q, k, v, mask, scale, window, sinks)

    def commit(self, new_tokens: int) -> None:
        self.buffer.commit(new_tokens)

    def _truncate(self, num_tokens: int) -> None:
        self.buffer.truncate(num_tokens)

    def _close(self) -> None:
        self._spare.give(self.buffer, [])
