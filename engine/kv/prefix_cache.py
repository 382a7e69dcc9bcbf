"""PrefixCache: a radix tree over token ids whose edges are KV blocks.

Every node is one block of one cached sequence: `block_size` tokens (a full
block, which may have children) or fewer (a partial block, always a leaf).
A path from the root spells a cached prefix; sequences that share a prefix
(a system prompt, the history before a regenerated reply or an edited
message) share its nodes and blocks.

Matching is exact to the token. Full blocks are followed by exact lookup;
then the child with the longest common prefix with the next tokens lends
those tokens: its block is copied (copy-on-write) into a block the request
owns, because the request will write different tokens after them. At most
len(tokens) - 1 tokens are matched, so a full hit still computes the last token.

Rules:
- A node referenced by a running request (refs > 0) is never evicted; refs are
  taken by `match` and `adopt` and dropped by `finish` / `release`.
- Blocks join the tree as requests complete them (`adopt`, prompt and generated
  tokens alike), so a concurrent request can already reuse them; a request's
  last, partial block joins when it ends (`finish`).
- A block is in exactly one place: the pool's free list, one node, or the
  `owned` set of one running request.
- Eviction takes unreferenced leaves, least recently used first. With a host
  tier, a device block is first copied to host memory and its node stays in
  the tree (device-resident nodes always form a prefix of each path);
  a later match copies it back. On a GPU both copies run on a copy stream
  (tier_copy.py), so the host never waits for them.
- K/V read from disk enter the tree with `load` (blocks filled in place),
  nodes marked `from_disk` until a match first uses them, so that match
  reports `disk`; `export` copies blocks out.
- `forget` drops the blocks a prefix would reuse and everything below them
  (after a request computed NaN from them), except referenced nodes.
- A hybrid model's cache (`checkpoint_budget` given) also keeps state checkpoints on its nodes, and a
  match ends at one: kv/checkpoints.py has their rules, and lists those on a path (for the block store)
  and files ones read from disk on nodes already in the tree.

One file, longer than the house's ~400 lines, on purpose: every operation here moves nodes and
blocks under the same rules (check_invariants). `load` and `export` were a mixin in a file of their
own, which reached into the tree's walk and tier moves all the same: one honest file reads better.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from engine.errors import EngineError
from engine.kv.checkpoints import CheckpointBook, cut_to_checkpoint
from engine.kv.node import Node
from engine.kv.pool import KVPool, PoolExhausted
from engine.kv.tier_copy import TierCopy
from engine.recurrent.state import SequenceState


class KVCacheFullError(EngineError):
    """Not enough KV blocks for a request, even after evicting everything unreferenced."""


@dataclass
class Match:
    """A request's view of the cache: the blocks it starts with and which of them it owns."""

    blocks: list[int]  # device blocks holding positions 0..cached_tokens
    owned: set[int]  # blocks the request may write (the copy-on-write block)
    shared: list[Node]  # the matched full blocks' nodes, referenced until finish()/release()
    cached_tokens: int
    source: str  # device | host | disk | none
    state: SequenceState | None = None  # a hybrid model's checkpoint at cached_tokens (read only), else None
    recomputed: int = 0  # cached tokens past the last checkpoint, which a hybrid model computes again


def common_prefix_length(a: "list[int] | tuple[int, ...]", b: "list[int] | tuple[int, ...]") -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    def __init__(self, pool: KVPool, host: KVPool | None = None, checkpoint_budget: int | None = None):
        """`checkpoint_budget`: bytes of state checkpoints to keep, for a hybrid model (None: attention only)."""
        self.pool = pool
        self.checkpoints = CheckpointBook(checkpoint_budget) if checkpoint_budget is not None else None
        self.host = host
        self.tier_copy = TierCopy(pool.data.device)
        self.reserved: set[int] = set()  # device blocks taken for good by `reserve_block`
        self.block_size = pool.block_size
        self.root = Node((), None)
        self.clock = 0  # logical time for LRU: deterministic, unlike wall time
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self._unseen = False  # see unseen()

    # ---- lookup and insertion -------------------------------------------------

    def match(self, tokens: list[int]) -> Match:
        """The longest cached prefix of tokens[:-1], loaded on the device, referenced."""
        self.clock += 1
        chain, lender, lent = self.walk(tokens, len(tokens) - 1)
        state, recomputed = None, 0
        if self.checkpoints is not None:
            walked = len(chain) * self.block_size + lent
            chain, lender, lent, state = cut_to_checkpoint(chain, lender, lent, self.block_size)
            recomputed = walked - len(chain) * self.block_size - lent
        used = chain + ([lender] if lender is not None else [])
        source = ("disk" if any(n.from_disk for n in used) else "host" if any(n.block is None for n in used)
                  else "device" if used else "none")
        for n in used:  # referenced before any allocation below can evict
            n.refs += 1
            n.last_used = self.clock
            n.from_disk = n.from_disk and self._unseen
        try:
            for n in used:
                self._ensure_on_device(n)
            owned: set[int] = set()
            blocks = [n.block for n in chain]
            if lender is not None:
                (copy,) = self.allocate(1)
                self.pool.copy_block(lender.block, copy)
                blocks.append(copy)
                owned.add(copy)
        except KVCacheFullError:
            for n in chain:
                n.refs -= 1
            raise
        finally:
            if lender is not None:
                lender.refs -= 1
        cached = len(chain) * self.block_size + lent
        if not self._unseen:
            self.prompt_tokens += len(tokens)
            self.hit_tokens += cached
        return Match(blocks, owned, chain, cached, source if cached else "none", state, recomputed)

    @contextlib.contextmanager
    def unseen(self) -> Iterator[None]:
        """Matches meanwhile are not requests (Engine.prewarm): they neither count toward the hit rate nor
        use up the `from_disk` marks, so the first real request still reports `disk`."""
        self._unseen = True
        try:
            yield
        finally:
            self._unseen = False

    def walk(self, tokens: "list[int] | tuple[int, ...]", limit: int) -> tuple[list[Node], Node | None, int]:
        """The nodes of the longest cached prefix of tokens[:limit]: the chain of full blocks, then the
        child that lends the most of the next tokens (or None) and how many it lends."""
        size, node, chain, pos = self.block_size, self.root, [], 0
        while pos + size <= limit:
            child = node.children.get(tuple(tokens[pos : pos + size]))
            if child is None:
                break
            chain.append(child)
            node, pos = child, pos + size
        want = tokens[pos : min(pos + size, limit)]
        lender, lent = None, 0
        for child in node.children.values():
            common = common_prefix_length(child.tokens, want)
            if common > lent:
                lender, lent = child, common
        return chain, lender, lent

    def cached_length(self, tokens: list[int]) -> int:
        """How many leading tokens the cache holds (any tier), without touching anything."""
        chain, lender, lent = self.walk(tokens, len(tokens))
        if self.checkpoints is not None:
            chain, _, lent, _ = cut_to_checkpoint(chain, lender, lent, self.block_size)
        return len(chain) * self.block_size + lent

    def adopt(self, parent: Node, piece: tuple[int, ...], block: int, owned: set[int]) -> Node:
        """File a full block that a running request has just completed, as a child of `parent`.

        The request keeps a reference to the returned node and must use its block
        from now on: if the tree already held these tokens there, the request's own
        copy goes back to the pool (or replaces a copy spilled to the host).
        """
        self.clock += 1
        node = parent.children.get(piece)
        if node is None:
            node = Node(piece, parent, block=block, last_used=self.clock)
            parent.children[piece] = node
            owned.discard(block)
            self._drop_superseded(parent, node)
        elif node.block is None and block in owned:
            self.host.release([node.host_block])
            node.block, node.host_block = block, None
            owned.discard(block)
        elif node.block != block and block in owned:
            owned.discard(block)
            self.pool.release([block])
        node.refs += 1
        node.last_used = self.clock
        return node

    def finish(self, chain: list[Node], tail: tuple[int, ...], tail_block: int | None, owned: set[int]) -> Node | None:
        """End a request whose full blocks are `chain`: file its last, partial block, drop its references,
        and return every block it still owns. Returns the node that now holds the tail's tokens (filed, or
        one that already lent them), for the request's last checkpoints; None without a tail."""
        parent = chain[-1] if chain else self.root
        holder = None
        if tail and tail_block in owned:
            self.clock += 1
            covered = [c for c in parent.children.values() if c.tokens[: len(tail)] == tail]
            if covered:  # the same or a longer block already lends these tokens
                for c in covered:
                    c.last_used = self.clock
                holder = max(covered, key=lambda c: len(c.tokens))  # the one a superseding walk keeps
            else:
                holder = Node(tail, parent, block=tail_block, last_used=self.clock)
                parent.children[tail] = holder
                owned.discard(tail_block)
                self._drop_superseded(parent, holder)
        self.release(owned, chain)
        return holder

    def file_checkpoint(self, node: Node, offset: int, state: SequenceState) -> None:
        """Keep a hybrid model's state after the token at `offset` of `node` (kv/checkpoints.py)."""
        if node.parent is None or node.parent.children.get(node.tokens) is not node:
            return  # the node left the tree meanwhile (evicted, forgotten): nothing to file on
        self.checkpoints.file(node, offset, state, self.nodes())

    def release(self, owned: set[int], shared: list[Node]) -> None:
        """Give up a request without caching anything it computed."""
        self.pool.release(sorted(owned))
        for n in shared:
            n.refs -= 1

    def _drop_superseded(self, parent: Node, new: Node) -> None:
        # A partial sibling whose tokens start `new` can lend nothing `new` cannot.
        for sibling in list(parent.children.values()):
            if (sibling is not new and len(sibling.tokens) < len(new.tokens) and not sibling.children
                    and sibling.refs == 0 and new.tokens[: len(sibling.tokens)] == sibling.tokens):
                if self.checkpoints is not None:
                    self.checkpoints.hand_over(sibling, new)
                self._remove(sibling)

    def forget(self, tokens: list[int]) -> int:
        """Drop what a match of `tokens` would use (its full blocks and the block lending its tail), with
        everything cached below them, so the next request for `tokens` computes them afresh (their K/V
        are not to be trusted). Nodes a running request references stay, with their ancestors.
        Returns how many blocks were dropped."""
        chain, lender, _ = self.walk(tokens, len(tokens))
        first = chain[0] if chain else lender
        return self._drop_unreferenced(first) if first is not None else 0

    def _drop_unreferenced(self, node: Node) -> int:
        dropped = sum(self._drop_unreferenced(child) for child in list(node.children.values()))
        if node.refs == 0 and not node.children:
            self._remove(node)
            dropped += 1
        return dropped

    # ---- K/V to and from disk (the block store) -------------------------------

    def export(self, tokens: list[int], first_block: int = 0) -> tuple[int, torch.Tensor] | None:
        """The longest cached prefix of `tokens`: its length and a copy of its blocks from `first_block`
        on, on the CPU [blocks, 2, layers, kv_heads, block_size, head_dim], positions past the prefix
        zeroed (none when the prefix has no more blocks than `first_block`)."""
        chain, lender, lent = self.walk(tokens, len(tokens))
        nodes = chain + ([lender] if lender is not None else [])
        if not nodes:
            return None
        blocks = torch.empty((max(0, len(nodes) - first_block), *self.pool.data.shape[1:]), dtype=self.pool.data.dtype)
        self.tier_copy.host_readable()
        for i, node in enumerate(nodes[first_block:]):  # block by block: no temporary of the export's size on the device
            blocks[i].copy_(self.pool.data[node.block] if node.block is not None else self.host.data[node.host_block])
        if lender is not None and len(nodes) > first_block:
            blocks[-1, :, :, :, lent:] = 0  # the lender's later tokens are not part of this sequence
        return len(chain) * self.block_size + lent, blocks

    def import_blocks(self, tokens: list[int], fill: Callable[[int, list[torch.Tensor]], int]) -> int:
        """File the K/V of `tokens` that the tree lacks, marked as read from disk; blocks it already holds
        are kept, not replaced. `fill(first, dests)` writes the K/V of blocks first, first + 1, ... of
        `tokens` into the tensors `dests` (each [2, layers, kv_heads, block_size, head_dim], on the CPU:
        pool blocks themselves, or a staging copy for a device pool) and returns how many it filled, in
        order (fewer: the rest could not be read). Returns how many tokens were added; raises
        KVCacheFullError if they do not fit."""
        size = self.block_size
        full = len(tokens) // size
        chain, _, _ = self.walk(tokens, full * size)
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

    # ---- memory ---------------------------------------------------------------

    def allocate(self, count: int) -> list[int]:
        """`count` free device blocks, evicting least recently used unreferenced blocks if needed."""
        short = count - self.pool.num_free
        if short > 0:
            self._evict_device(short)
        try:
            return self.pool.allocate(count)
        except PoolExhausted:
            raise KVCacheFullError(
                f"The KV cache is full: {count} more blocks of {self.block_size} tokens are needed but only "
                f"{self.pool.num_free} could be freed; raise --kv-cache-gb or start a new conversation."
            ) from None

    def reserve_block(self) -> int:
        """A device block taken out of the cache for good (e.g. a scratch block for CUDA-graph capture)."""
        (block,) = self.allocate(1)
        self.reserved.add(block)
        return block

    def _ensure_on_device(self, node: Node) -> None:
        if node.block is not None:
            return
        (block,) = self.allocate(1)
        self.tier_copy.copy(self.pool.data[block], self.host.data[node.host_block])
        self.host.release([node.host_block])
        node.block, node.host_block = block, None

    def _device_evictable(self, node: Node) -> bool:
        if node is self.root or node.block is None or node.refs > 0:
            return False
        if self.host is None:
            return not node.children
        return all(c.block is None for c in node.children.values())

    def _evict_device(self, count: int) -> None:
        heap = [(n.last_used, id(n), n) for n in self.nodes() if self._device_evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < count and heap:
            _, _, node = heapq.heappop(heap)
            if not self._device_evictable(node):
                continue
            parent = node.parent
            if not self._spill(node):
                self._remove(node)
            freed += 1
            if self._device_evictable(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))

    def _spill(self, node: Node) -> bool:
        """Move a node's block to the host tier; False if there is no room there."""
        if self.host is None:
            return False
        if self.host.num_free == 0:
            victims = [n for n in self.nodes() if n.block is None and not n.children and n.refs == 0]
            if not victims:
                return False
            self._remove(min(victims, key=lambda n: n.last_used))
        (host_block,) = self.host.allocate(1)
        self.tier_copy.copy(self.host.data[host_block], self.pool.data[node.block])
        self.pool.release([node.block])
        node.block, node.host_block = None, host_block
        return True

    def _remove(self, node: Node) -> None:
        """Drop a node and everything below it, returning their blocks."""
        for child in list(node.children.values()):
            self._remove(child)
        if node.block is not None:
            self.pool.release([node.block])
        if node.host_block is not None:
            self.host.release([node.host_block])
        if self.checkpoints is not None:
            self.checkpoints.drop(node)
        del node.parent.children[node.tokens]

    # ---- inspection -----------------------------------------------------------

    def nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def stats(self) -> dict:
        total, per_block = self.pool.num_blocks, self.pool.nbytes_per_block
        used = total - self.pool.num_free
        return {
            "block_size": self.block_size,
            "blocks_used": used,
            "blocks_total": total,
            "bytes_used": used * per_block,
            "bytes_total": total * per_block,
            "cached_blocks": sum(1 for n in self.nodes() if n.block is not None),
            "host_blocks": sum(1 for n in self.nodes() if n.host_block is not None),
            "hit_rate": round(self.hit_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
        }

    def _start(self, node: Node) -> int:
        """The position of `node`'s first token."""
        depth = 0
        while node.parent is not self.root:
            node, depth = node.parent, depth + 1
        return depth * self.block_size

    def check_invariants(self, owned_by_requests: set[int] = frozenset()) -> None:
        """Raise AssertionError if any rule in the module docstring is broken (for tests)."""
        size = self.block_size
        device_places = list(self.pool.free_blocks()) + list(owned_by_requests) + list(self.reserved)
        host_places = list(self.host.free_blocks()) if self.host is not None else []
        for node in self.nodes():
            assert node.parent.children.get(node.tokens) is node, "node not filed under its tokens"
            assert node.refs >= 0, "negative reference count"
            assert 1 <= len(node.tokens) <= size, "node token count out of range"
            assert not node.children or len(node.tokens) == size, "a partial block has children"
            assert (node.block is None) != (node.host_block is None), "a node must be in exactly one tier"
            for offset, state in node.checkpoints.items():
                assert self.checkpoints is not None, "a checkpoint in an attention-only model's cache"
                assert 1 <= offset <= len(node.tokens), "a checkpoint past its block's tokens"
                assert state.position == self._start(node) + offset, "a checkpoint filed at another position"
            if node.block is not None:
                assert node.parent is self.root or node.parent.block is not None, "device nodes must form a prefix"
                device_places.append(node.block)
            else:
                host_places.append(node.host_block)
        assert sorted(device_places) == list(range(self.pool.num_blocks)), "a device block is lost or doubled"
        if self.host is not None:
            assert sorted(host_places) == list(range(self.host.num_blocks)), "a host block is lost or doubled"
        if self.checkpoints is not None:
            kept = sum(s.nbytes for n in self.nodes() for s in n.checkpoints.values())
            assert kept == self.checkpoints.nbytes, "the checkpoints' bytes are miscounted"
