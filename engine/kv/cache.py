"""What the model needs from a sequence's K/V, and the contiguous buffer that keeps K/V in one piece.

The model calls `reserve(T)`, then `attention(layer, q, k, v, mask, scale)` once per layer (store the T
new tokens' K/V and attend over the whole sequence), then `commit(T)`. A request's K/V add the rules
of kv/sequence.py (final tokens, truncation, close) on top of this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from engine.attention.dense import attend
from engine.recurrent.state import STALE, LayerState, SequenceState


class KVAttention(Protocol):
    """What a decoder layer needs: store the new tokens' K/V, attend over all (a captured decode step
    passes only this, see decode/graph_runner.py)."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor: ...

    def layer_state(self, layer: int) -> LayerState:
        """A recurrent layer's state for these tokens (a hybrid model's; engine/recurrent/state.py), which
        the layer reads and updates in place."""
        ...


class KVCache(ABC):
    """K/V of every layer for the tokens of one sequence, in position order; for a hybrid model, also its
    recurrent layers' state after those tokens (`state`, None for an attention-only model)."""

    state: SequenceState | None = None

    def layer_state(self, layer: int) -> LayerState:
        if self.state is None:
            raise ValueError("an attention-only cache keeps no recurrent state")
        if self.state.position != self.num_tokens:  # a bug, never a user's mistake: say where it is
            raise RuntimeError(f"the recurrent state is at position {self.state.position}, its K/V at "
                               f"{self.num_tokens}: load a checkpoint after cutting or filling K/V")
        return self.state.layer(layer)

    @property
    @abstractmethod
    def num_tokens(self) -> int:
        """Tokens whose K/V are stored (and committed)."""

    @abstractmethod
    def reserve(self, new_tokens: int) -> None:
        """Make room for `new_tokens` more tokens before a forward pass."""

    @abstractmethod
    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Store k/v [kv_heads, T, head_dim] of the T new tokens; attend q [T, heads, head_dim] over
        the whole sequence (a sliding-window layer: over the last `window` keys of each query).
        Returns [T, heads * head_dim]. `mask` is `window_causal_mask(T, S, window)`.
        Every layer stores the same T tokens in one pass."""

    @abstractmethod
    def commit(self, new_tokens: int) -> None:
        """Count the `new_tokens` stored by the last forward pass."""


class ContiguousKVCache(KVCache):
    """One growing buffer per K and V: [layers, kv_heads, capacity, head_dim]."""

    GROWTH_QUANTUM = 256  # tokens; capacity is kept a multiple of this

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                 device: torch.device, dtype: torch.dtype, state: SequenceState | None = None):
        """`state`: a hybrid model's recurrent state (zeros, at position 0); `num_layers` its attention layers."""
        self.state = state
        self._shape = (num_layers, num_kv_heads, 0, head_dim)
        self._max_tokens = max_tokens
        self._device, self._dtype = device, dtype
        self._length = 0
        self._k = self._v = torch.empty(self._shape, device=device, dtype=dtype)

    @property
    def num_tokens(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        return self._k.shape[2]

    def reserve(self, new_tokens: int) -> None:
        needed = self._length + new_tokens
        if needed > self._max_tokens:
            raise ValueError(f"KV cache of {self._max_tokens} tokens cannot hold {needed}")
        if needed <= self.capacity:
            return
        # Grow geometrically so a long reply costs O(log n) copies, not O(n).
        quantum = self.GROWTH_QUANTUM
        grown = max(needed, 2 * self.capacity)
        grown = min(self._max_tokens, -(-grown // quantum) * quantum)
        layers, heads, _, dim = self._shape
        # Ordinary pages, as the pool's (kv/pool.py says why): decode at 2,048 tokens read them as fast.
        k = torch.empty((layers, heads, grown, dim), device=self._device, dtype=self._dtype)
        v = torch.empty_like(k)
        k[:, :, : self._length] = self._k[:, :, : self._length]
        v[:, :, : self._length] = self._v[:, :, : self._length]
        self._k, self._v = k, v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's K/V [kv_heads, T, head_dim] of the T new tokens; returns the layer's K/V
        [kv_heads, num_tokens + T, head_dim] of the whole sequence, the new tokens last."""
        end = self._length + k.shape[1]
        self._k[layer, :, self._length : end] = k
        self._v[layer, :, self._length : end] = v
        return self._k[layer, :, :end], self._v[layer, :, :end]

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        k_all, v_all = self.write(layer, k, v)
        return attend(q, k_all, v_all, mask, scale, window, sinks)

    def commit(self, new_tokens: int) -> None:
        if self.state is not None and self.state.position == self._length:  # the recurrent layers took them in
            self.state.position += new_tokens
        self._length += new_tokens

    def truncate(self, length: int) -> None:
        """Keep positions 0..length and the buffers (their pages are already mapped). A recurrent state
        cannot go back: cut anywhere but its position (or 0, where it is zeros) it is stale until a checkpoint
        is loaded (`layer_state` refuses a stale state)."""
        self._length = min(self._length, length)
        if self.state is not None and self.state.position != self._length:
            if self._length == 0:
                self.state.reset()
            elif not self.state.rewind(self._length):  # a verified step's rejected drafts: back to the last kept
                self.state.position = STALE

    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole K and V buffers [layers, kv_heads, capacity, head_dim] (for the fused CPU decode step,
        which writes the next position itself)."""
        return self._k, self._v

    def positions(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions start..end, all layers: views [layers, kv_heads, end - start, head_dim]."""
        return self._k[:, :, start:end], self._v[:, :, start:end]

    def fill(self, end: int, load) -> None:
        """Extend to `end` positions, written by `load(start, end, k, v)` (for cached prefixes)."""
        start = self._length
        self.reserve(end - start)
        load(start, end, self._k, self._v)
        if self.state is not None and end > start:  # K/V from elsewhere: the recurrent layers did not see them
            self.state.position = STALE
        self.commit(end - start)
