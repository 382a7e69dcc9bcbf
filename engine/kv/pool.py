"""KVPool: K/V of all layers in fixed-size blocks, allocated once on the device, with a free list.

One tensor [blocks, 2 (K, V), layers, kv_heads, block_size, head_dim]: a block
holds `block_size` consecutive positions of one sequence for every layer, so
moving a block (copy-on-write, spill to host, an export) is one copy.
Ownership (who may free a block) is tracked by PrefixCache, not here.
"""

from __future__ import annotations

import torch


class PoolExhausted(Exception):
    """Fewer free blocks than asked for."""


class KVPool:
    def __init__(self, num_blocks: int, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype, pin_memory: bool = False):
        if num_blocks < 1:
            raise ValueError("a KV pool needs at least one block")
        self.block_size = block_size
        # empty, not zeros: pages are only touched when a block is first written. Ordinary pages, not
        # transparent huge ones: in a VM whose host takes back free memory (free page reporting, as on
        # Firecracker), a fresh 2 MiB page must be backed by the host first, and its first write stalled up to
        # 18 ms, inside a decode step every stream of a batch waits on; a resume of 2,048 tokens from disk took
        # 368-612 ms with huge pages asked for, 63-77 without (on bare metal they saved ~30 ms of it).
        self.data = torch.empty((num_blocks, 2, num_layers, num_kv_heads, block_size, head_dim),
                                device=device, dtype=dtype, pin_memory=pin_memory)
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first

    @staticmethod
    def block_bytes(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * block_size * head_dim * dtype.itemsize

    @property
    def num_blocks(self) -> int:
        return self.data.shape[0]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def nbytes_per_block(self) -> int:
        return self.data[0].nbytes

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise PoolExhausted(f"{count} blocks asked, {len(self._free)} free")
        taken = self._free[len(self._free) - count :]
        del self._free[len(self._free) - count :]
        return taken[::-1]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    def free_blocks(self) -> set[int]:
        return set(self._free)

    def copy_block(self, src: int, dst: int) -> None:
        self.data[dst].copy_(self.data[src])

    def store(self, blocks: list[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write positions start..start+n of a sequence, from k/v [layers, kv_heads, n, head_dim]."""
        size, n, pos = self.block_size, k.shape[2], 0
        while pos < n:
            block, offset = divmod(start + pos, size)
            take = min(size - offset, n - pos)
            self.data[blocks[block], 0, :, :, offset : offset + take] = k[:, :, pos : pos + take]
            self.data[blocks[block], 1, :, :, offset : offset + take] = v[:, :, pos : pos + take]
            pos += take

    def read_into(self, blocks: list[int], start: int, end: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Read positions start..end of a sequence into the same positions of k/v [layers, kv_heads, >= end, head_dim]."""
        size, pos = self.block_size, start
        while pos < end:
            block, offset = divmod(pos, size)
            take = min(size - offset, end - pos)
            k[:, :, pos : pos + take] = self.data[blocks[block], 0, :, :, offset : offset + take]
            v[:, :, pos : pos + take] = self.data[blocks[block], 1, :, :, offset : offset + take]
            pos += take

    # Per-layer access for attention that reads the pool in place (paged attention).

    def layer_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer in every block: strided views [num_blocks, kv_heads, block_size, head_dim]."""
        return self.data[:, 0, layer], self.data[:, 1, layer]

    def write_slots(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one layer's k/v [T, kv_heads, head_dim] at (blocks[t], offsets[t]), index tensors [T].

        Tensor indices only, no host sync: safe inside a captured CUDA graph."""
        write_slots(self.data, layer, blocks, offsets, k, v)

    def gather_layer(self, layer: int, table: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K/V of positions 0..end of the sequence whose blocks are `table` [n] (a copy):
        [kv_heads, end, head_dim] each."""
        k_cache, v_cache = self.layer_view(layer)

        def gather(cache: torch.Tensor) -> torch.Tensor:
            blocks = cache.index_select(0, table)  # [n, kv_heads, block_size, head_dim]
            return blocks.transpose(0, 1).reshape(blocks.shape[1], -1, blocks.shape[3])[:, :end]

        return gather(k_cache), gather(v_cache)


# An opaque op that mutates the pool in place. Written as plain indexing inside torch.compile, the
# write is functionalised into a fresh copy of the whole pool per step (measured: 0.5 GiB pool, tiny
# model, 165 -> 1.9 tokens/s); as a custom op that declares its mutation, it stays in place.
@torch.library.custom_op("kvchat::write_slots", mutates_args=("data",))
def write_slots(data: torch.Tensor, layer: int, blocks: torch.Tensor, offsets: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor) -> None:
    data[blocks, 0, layer, :, offsets] = k
    data[blocks, 1, layer, :, offsets] = v
