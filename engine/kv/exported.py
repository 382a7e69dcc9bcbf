"""ExportedKV: the K/V of one cached token sequence, copied out of the prefix cache (Engine.export_kv)
for the block store, with a hybrid model's state checkpoint (ExportedCheckpoint) where it has one.

Plain data, so storage can write and read it without knowing the engine.
`kv` is laid out as the KV pool's blocks, [blocks, 2 (K, V), layers, kv_heads,
block_size, head_dim], on the CPU, positions past the last token zeroed; going
back into the pool is then one copy, not one per token. An
export for the block store may hold only the blocks from `first_block` on:
the ones before it are on disk already. One read from an older kvchat's file
(storage/kv/legacy/) may have a read-only mapping of that file as `kv`: copy
from it, never write to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExportedCheckpoint:
    """A hybrid model's recurrent state after `position` tokens of a sequence (engine/kv/checkpoints.py), as
    plain tensors on the CPU in SequenceState.tensors() order: per recurrent layer, its convolution state,
    then its recurrent matrix if it has one."""

    position: int  # tokens the state summarises: it is the state after token position - 1
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class ExportedKV:
    token_ids: tuple[int, ...]
    kv: torch.Tensor
    fingerprint: str  # Engine.fingerprint of the engine that computed it
    first_block: int = 0  # kv holds blocks first_block, first_block + 1, ... of token_ids
    # A hybrid model's checkpoints on the path of token_ids, first position first (none: attention only).
    checkpoints: tuple[ExportedCheckpoint, ...] = ()

    @property
    def block_size(self) -> int:
        return self.kv.shape[4]

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes + sum(c.nbytes for c in self.checkpoints)
