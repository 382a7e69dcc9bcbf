"""What the block store's size cap evicts (KVBlockStore.enforce_cap): whole blocks, least recently used
first, with the checkpoints only they hold.

Blocks no conversation references (a deleted conversation's, a superseded partial block) go before any
that one does, and referenced ones from the ends of chains, so what is left of a chain stays loadable.
A checkpoint is held by the blocks after its parent that start with its tokens (index.py): its bytes
are freed with the last of them. Plain rows in, keys out: the store does the removing.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from storage.kv.index import BlockRow, CheckpointRow


def holders(rows: Sequence[BlockRow], checkpoints: Sequence[CheckpointRow]) -> dict[str, list[str]]:
    """checkpoint key -> the keys of the blocks holding it (after its parent, starting with its tokens)."""
    after = defaultdict(list)
    for row in rows:
        after[row.parent].append(row)
    return {c.key: [r.key for r in after[c.parent] if r.token_ids[: len(c.token_ids)] == c.token_ids]
            for c in checkpoints}


@dataclass(frozen=True)
class Eviction:
    blocks: list[str]  # keys of the blocks to remove (their unheld checkpoints go with them)
    unheld: list[str]  # keys of checkpoints no block holds already (a race with another kvchat's eviction)
    freed: int  # bytes of both, and of the checkpoints the blocks take with them


def evict(rows: Sequence[BlockRow], checkpoints: Sequence[CheckpointRow], referenced: dict[str, int],
          cap: int) -> Eviction:
    """The blocks to remove so that the store's blocks and checkpoints fit in `cap` bytes."""
    held = holders(rows, checkpoints)
    unheld = [c for c in checkpoints if not held[c.key]]
    held_by, left = defaultdict(list), {c.key: len(held[c.key]) for c in checkpoints}
    for c in checkpoints:
        for holder in held[c.key]:
            held_by[holder].append(c)
    total = sum(row.bytes for row in rows) + sum(c.bytes for c in checkpoints)
    freed = sum(c.bytes for c in unheld)
    total -= freed
    children = Counter(row.parent for row in rows)
    by_key = {row.key: row for row in rows}
    victims: list[str] = []

    def take(row: BlockRow) -> None:
        nonlocal total, freed
        victims.append(row.key)
        gone = row.bytes
        for c in held_by[row.key]:  # a checkpoint goes with the last block holding it
            left[c.key] -= 1
            gone += c.bytes if left[c.key] == 0 else 0
        total, freed = total - gone, freed + gone
        children[row.parent] -= 1

    for row in sorted((r for r in rows if r.key not in referenced), key=lambda r: r.last_used):
        if total <= cap:
            break
        take(row)
    leaves = [(r.last_used, r.key) for r in rows if r.key in referenced and children[r.key] == 0]
    heapq.heapify(leaves)
    while total > cap and leaves:
        _, key = heapq.heappop(leaves)
        row = by_key[key]
        take(row)
        parent = by_key.get(row.parent)
        if parent is not None and parent.key in referenced and children[parent.key] == 0:
            heapq.heappush(leaves, (parent.last_used, parent.key))
    return Eviction(victims, [c.key for c in unheld], freed)
