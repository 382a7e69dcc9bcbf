"""CacheTransfer: K/V blocks into and out of the prefix cache, for snapshots and the block store on disk.

A mixin of PrefixCache (it uses the tree's walk, allocation and nodes). `export`
copies a cached sequence's blocks out (all of them, or those from one block on:
what the block store does not hold yet). `load` files blocks that a reader
fills in place (a CPU pool's own blocks: no copy between the file and the
cache). Nodes filed here are marked `from_disk` until a match first uses them,
so that match reports `disk`.
"""

from __future__ import annotations

from collections.abc import Callable
import torch

from engine.kv.node import Node


class CacheTransfer:
    def export(self, tokens: list[int], first_block: int = 0) -> tuple[int, torch.Tensor] | None:
        """The longest cached prefix of `tokens`: its length and a copy of its blocks from `first_block`
        on, on the CPU [blocks, 2, layers, kv_heads, block_size, head_dim], positions past the prefix
        zeroed (none when the prefix has no more blocks than `first_block`)."""
        chain, lender, lent = self._walk(tokens, len(tokens))
        nodes = chain + ([lender] if lender is not None else [])
        if not nodes:
            return None
        blocks = torch.empty((max(0, len(nodes) - first_block), *self.pool.data.shape[1:]), dtype=self.pool.data.dtype)
        self.tier_copy.host_readable()
        for i, node in enumerate(nodes[first_block:]):  # block by block: no temporary of the snapshot's size on the device
            blocks[i].copy_(self.pool.data[node.block] if node.block is not None else self.host.data[node.host_block])
        if lender is not None and len(nodes) > first_block:
            blocks[-1, :, :, :, lent:] = 0  # the lender's later tokens are not part of this sequence
        return len(chain) * self.block_size + lent, blocks

    def load(self, tokens: list[int], fill: Callable[[int, list[torch.Tensor]], int]) -> int:
        """File the K/V of `tokens` that the tree lacks, marked as read from disk; blocks it already holds
        are kept, not replaced. `fill(first, dests)` writes the K/V of blocks first, first + 1, ... of
        `tokens` into the tensors `dests` (each [2, layers, kv_heads, block_size, head_dim], on the CPU:
        pool blocks themselves, or a staging copy for a device pool) and returns how many it filled, in
        order (fewer: the rest could not be read). Returns how many tokens were added; raises
        KVCacheFullError if they do not fit."""
        size = self.block_size
        full = len(tokens) // size
        chain, _, _ = self._walk(tokens, full * size)
        tail = tuple(tokens[full * size :])
        parent = chain[-1] if chain else self.root
        tail_covered = not tail or (len(chain) == full and any(
            c.tokens[: len(tail)] == tail for c in parent.children.values()))
        new = list(range(len(chain), full)) + ([] if tail_covered else [full])
        if not new:
            return 0
        self.clock += 1
        for n in chain:  # the path stays put while allocating may evict
            n.refs += 1
        try:
            for n in chain:  # new nodes hang below the chain, and device nodes form a prefix of each path
                self._ensure_on_device(n)
            fresh = self.allocate(len(new))
        finally:
            for n in chain:
                n.refs -= 1
        on_cpu = self.pool.data.device.type == "cpu"
        staging = None if on_cpu else torch.empty((len(new), *self.pool.data.shape[1:]), dtype=self.pool.data.dtype)
        dests = [self.pool.data[b] for b in fresh] if on_cpu else list(staging)
        try:
            filled = max(0, min(len(new), fill(new[0], dests)))
        except BaseException:
            self.pool.release(fresh)
            raise
        self.pool.release(fresh[filled:])
        added = 0
        for i, block in zip(new[:filled], fresh):
            if staging is not None:
                self.pool.data[block].copy_(staging[i - new[0]])
            piece = tuple(tokens[i * size : (i + 1) * size])
            node = Node(piece, parent, block=block, last_used=self.clock, from_disk=True)
            parent.children[piece] = node
            self._drop_superseded(parent, node)
            parent = node
            added += len(piece)
        return added
