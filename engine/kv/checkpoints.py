"""State checkpoints: how the prefix cache serves a hybrid model, whose recurrent layers keep a state, not K/V.

A recurrent layer's state after position p summarises every token before p; it cannot be cut at another
position, only copied where it was computed. So for a hybrid model (Qwen3.5, LFM2) a cached prefix is
usable only up to a position where the state was copied: a *checkpoint*.

Rules (PrefixCache.check_invariants checks the first two):
- A checkpoint is the recurrent state after position p of a cached sequence, filed on the node whose block
  holds token p - 1, at offset p - (the node's first position), 1..len(node.tokens). It is therefore keyed
  by every token up to p (the node's path), and leaves the tree with its node (eviction, `forget`,
  a partial node superseded by a longer one hands its checkpoints over first).
- Filed checkpoints are never written: a request loads a copy into its own state.
- Taken by a request (kv/pooled.py) at the end of its prompt but the last token (p = len(prompt) - 1: the
  same prompt again, regenerated, or a longer one starts there, and a match always computes the last
  token), every CHECKPOINT_EVERY tokens of a long prompt, and at the end of its final tokens when it closes
  (the next turn of the conversation starts there). They are filed once their node is in the tree (only
  final tokens are, kv/sequence.py), so a draft's state is never filed.
- A hybrid match is the longest cached prefix that ends at a checkpoint (or nothing); the K/V cached past
  it are computed again, and the match says how many (`recomputed`).
- Their memory is bounded (`budget` bytes): past it, the least recently used nodes' checkpoints go first.
  Dropping one never makes a result wrong, only a later prefill longer.
- On disk (the block store) a turn keeps the last checkpoint of its export (Engine.export_kv); one read
  back is filed by PrefixCache.import_checkpoints on a node already in the tree, never over another.
An attention-only model is the case with no state: every position is a checkpoint, nothing is stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import torch

from engine.kv.node import Node
from engine.recurrent.state import SequenceState

# Tokens of a long prompt between checkpoints (besides its end). Memory against recompute, measured at
# Qwen3.5-0.8B's shape on this 2-core CPU (fp32): a checkpoint is 19.3 MiB, the K/V of ~820 tokens (24 KiB a
# token: 6 attention layers of 24); a cold prefill runs ~77 tokens/s (1,052 tokens in 13.7 s). Every 1,024
# tokens keeps the checkpoints' memory under the K/V's own (+78%), and a branch inside a long prompt
# recomputes at most 1,023 tokens (~13 s here, 6.6 s on average); every 512 would double that memory to
# halve the wait. Branches inside long prompts are rare next to follow-ups (which start at a reply's end).
CHECKPOINT_EVERY = 1024


def wanted_positions(prompt_length: int) -> set[int]:
    """Where a request for a prompt of `prompt_length` tokens takes a checkpoint while prefilling it."""
    end = prompt_length - 1
    return {p for p in range(CHECKPOINT_EVERY, end, CHECKPOINT_EVERY)} | ({end} if end > 0 else set())


def cut_to_checkpoint(chain: list[Node], lender: Node | None, lent: int,
                      block_size: int) -> tuple[list[Node], Node | None, int, SequenceState | None]:
    """The longest part of a walked prefix (full blocks `chain`, then `lent` tokens of `lender`) that ends
    at a checkpoint: (full blocks, the node lending the rest or None, how many it lends, the checkpoint).
    Nothing matched when no node on the way has a checkpoint."""
    if lender is not None:
        offsets = [o for o in lender.checkpoints if o <= lent]
        if offsets:
            best = max(offsets)
            return chain, lender, best, lender.checkpoints[best]
    for i in range(len(chain) - 1, -1, -1):
        node = chain[i]
        if node.checkpoints:
            best = max(node.checkpoints)
            if best == block_size:
                return chain[: i + 1], None, 0, node.checkpoints[best]
            return chain[:i], node, best, node.checkpoints[best]
    return [], None, 0, None


class CheckpointBook:
    """The checkpoints' memory across the tree: what they take and the budget they keep to."""

    def __init__(self, budget: int):
        self.budget = budget
        self.nbytes = 0

    def file(self, node: Node, offset: int, state: SequenceState, nodes) -> None:
        """Keep `state` at `offset` of `node` (a checkpoint already there is kept: the same state), then
        drop the least recently used others while over budget. `nodes`: every node of the tree."""
        if not 1 <= offset <= len(node.tokens):
            raise ValueError(f"a checkpoint at offset {offset} of a block of {len(node.tokens)} tokens")
        if offset in node.checkpoints:
            return
        node.checkpoints[offset] = state
        self.nbytes += state.nbytes
        if self.nbytes > self.budget:
            self._trim(node, nodes)

    def _trim(self, keep: Node, nodes) -> None:
        order = sorted((n for n in nodes if n.checkpoints and n is not keep), key=lambda n: n.last_used)
        for node in order:
            if self.nbytes <= self.budget:
                return
            self.drop(node)

    def drop(self, node: Node) -> None:
        """Forget `node`'s checkpoints (it leaves the tree, or the budget needs their memory)."""
        self.nbytes -= sum(state.nbytes for state in node.checkpoints.values())
        node.checkpoints.clear()

    def hand_over(self, old: Node, new: Node) -> None:
        """`new` supersedes `old` (its tokens start with all of old's): old's checkpoints move to it."""
        for offset, state in old.checkpoints.items():
            if offset in new.checkpoints:
                self.nbytes -= state.nbytes
            else:
                new.checkpoints[offset] = state
        old.checkpoints.clear()


# ---- checkpoints to and from disk (the block store keeps each turn's last); `cache` is a PrefixCache ----

def path_checkpoints(cache, tokens: list[int]) -> list[tuple[int, SequenceState]]:
    """The checkpoints on the path `export(tokens)` copies, as (position, state), first position first
    (none for an attention-only model). The states are the filed ones: copy them, never write them."""
    if cache.checkpoints is None:
        return []
    chain, lender, lent = cache.walk(tokens, len(tokens))
    found = [(i * cache.block_size + offset, state)
             for i, node in enumerate(chain) for offset, state in node.checkpoints.items()]
    if lender is not None:
        found += [(len(chain) * cache.block_size + offset, state)
                  for offset, state in lender.checkpoints.items() if offset <= lent]
    return sorted(found, key=lambda item: item[0])

def import_checkpoints(cache, tokens: list[int], checkpoints: Iterable[tuple[int, Sequence[torch.Tensor]]],
                       template: SequenceState) -> int:
    """File checkpoints read from disk, each (position, its tensors in SequenceState.tensors() order), on
    the nodes of `tokens` that `import_blocks` (or requests) put in the tree. Skipped: one whose node is
    not in the tree, whose position is not within `tokens`, whose tensors do not fit `template` (a zero
    state of this model: another model's state), or where a checkpoint is filed already (the same
    state: never replaced). Returns how many were filed."""
    if cache.checkpoints is None:
        return 0
    size, filed = cache.block_size, 0
    for position, tensors in checkpoints:
        if not 1 <= position <= len(tokens):
            continue
        index = (position - 1) // size
        offset = position - index * size
        node = _holder(cache, tokens, index, offset)
        if node is None or offset in node.checkpoints:
            continue
        state = template.with_tensors(tensors, position)
        if state is not None:
            cache.checkpoints.file(node, offset, state, cache.nodes())
            filed += 1
    return filed

def _holder(cache, tokens: list[int], index: int, offset: int) -> Node | None:
    """The node of block `index` of `tokens` whose first `offset` tokens are theirs: the one holding the
    block of `tokens` itself, else the longest that starts with them (the one a superseding walk keeps)."""
    chain, _, _ = cache.walk(tokens, index * cache.block_size)
    if len(chain) < index:
        return None
    parent = chain[-1] if chain else cache.root
    start = index * cache.block_size
    exact = parent.children.get(tuple(tokens[start : start + cache.block_size]))
    if exact is not None:
        return exact
    want = tuple(tokens[start : start + offset])
    covering = [c for c in parent.children.values() if c.tokens[:offset] == want]
    return max(covering, key=lambda c: len(c.tokens)) if covering else None
