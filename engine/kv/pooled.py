"""PooledKV: a request's K/V in blocks of the prefix cache's pool (what working-copy and paged share).

The request starts from a prefix cache match (its shared blocks referenced, a copied partial block
owned) and allocates blocks as it grows. Blocks it owns are its own until they join the tree: a full
block when `finalize` completes it, the last partial one at `close` (kv/sequence.py's rules). With
`publish=False` nothing joins the tree and every block it owns goes back to the pool.

A hybrid model's request also takes state checkpoints where kv/checkpoints.py says (the runner's forward
records the state there and calls `take_checkpoint`; `close` takes the last), and files each on the node of the
tree that holds its position once that node is there.
"""

from __future__ import annotations

from engine.kv.checkpoints import wanted_positions
from engine.kv.prefix_cache import Match, Node, PrefixCache
from engine.kv.sequence import SequenceKV
from engine.recurrent.state import SequenceState


class PooledKV(SequenceKV):
    def __init__(self, cache: PrefixCache, match: Match, prompt_ids: list[int], publish: bool):
        super().__init__(prompt_ids[: match.cached_tokens])
        self.cache = cache
        self.blocks = list(match.blocks)
        self.owned = set(match.owned)
        self.chain: list[Node] = list(match.shared)  # referenced nodes of this sequence's full final blocks
        self.publish = publish
        self._length = match.cached_tokens
        self.recomputed = match.recomputed
        hybrid = publish and cache.checkpoints is not None
        self._wanted = wanted_positions(len(prompt_ids)) if hybrid else set()
        self._pending: dict[int, SequenceState] = {}  # position -> checkpoint not filed yet

    @property
    def num_tokens(self) -> int:
        return self._length

    def reserve(self, new_tokens: int) -> None:
        missing = -(-(self._length + new_tokens) // self.cache.block_size) - len(self.blocks)
        if missing > 0:
            fresh = self.cache.allocate(missing)
            self.blocks += fresh
            self.owned.update(fresh)

    def commit(self, new_tokens: int) -> None:
        self._length += new_tokens

    def _finalized(self) -> None:
        """File every full block of final tokens not yet in the tree."""
        if not self.publish:
            return
        size, root = self.cache.block_size, self.cache.root
        while (len(self.chain) + 1) * size <= self.num_final:
            index = len(self.chain)
            piece = tuple(self.final_tokens[index * size : (index + 1) * size])
            node = self.cache.adopt(self.chain[-1] if self.chain else root, piece, self.blocks[index], self.owned)
            self.blocks[index] = node.block
            self.chain.append(node)
        self._file_pending()

    def checkpoints_between(self, start: int, end: int) -> list[int]:
        return sorted(p for p in self._wanted if start < p <= end)

    def take_checkpoint(self, position: int) -> None:
        state = self.state.recorded(position) or (self.state.copy() if position == self.state.position else None)
        if state is not None:
            self._pending[position] = state
            self._file_pending()

    def _file_pending(self, tail: Node | None = None) -> None:
        """File each pending checkpoint whose position is final and whose node is in the tree: one of the
        chain's full blocks, or `tail` (the node holding the last, partial block, at close)."""
        size = self.cache.block_size
        for position in sorted(self._pending):
            index = (position - 1) // size
            node = self.chain[index] if index < len(self.chain) else tail if index == len(self.chain) else None
            if node is not None and position <= self.num_final:
                self.cache.file_checkpoint(node, position - index * size, self._pending.pop(position))

    def _truncate(self, num_tokens: int) -> None:
        keep = -(-num_tokens // self.cache.block_size)
        dropped = set(self.blocks[keep:])  # past every final position, so never in the tree: owned
        self.blocks = self.blocks[:keep]
        self.owned -= dropped
        self.cache.release(dropped, [])  # the prefix cache keeps the books of who owns a block
        self._length = num_tokens

    def _close(self) -> None:
        if not self.publish:
            self.cache.release(self.owned, self.chain)
            return
        start = len(self.chain) * self.cache.block_size
        tail = tuple(self.final_tokens[start:])
        hybrid = self.cache.checkpoints is not None
        if hybrid and self.num_final and self.state.position != self.num_final:
            self.state.rewind(self.num_final)  # a reply that ended inside a verified step: back to its end
        if hybrid and self.num_final and self.state.position == self.num_final:  # where the next turn starts
            self._pending.setdefault(self.num_final, self.state.copy())
        chain = list(self.chain)  # finish drops their references, not the nodes
        holder = self.cache.finish(self.chain, tail, self.blocks[len(self.chain)] if tail else None, self.owned)
        if hybrid:
            self.chain = chain
            self._file_pending(holder)
        self._pending.clear()
