"""Node: one block of one cached sequence in the prefix cache's radix tree (kv/prefix_cache.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.recurrent.state import SequenceState


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]
    parent: "Node | None"
    block: int | None = None  # device block, or None while spilled to the host tier
    host_block: int | None = None
    children: dict[tuple[int, ...], "Node"] = field(default_factory=dict)
    refs: int = 0
    last_used: int = 0
    from_disk: bool = False  # loaded from disk (PrefixCache.import_blocks) and not used by a request yet
    # A hybrid model's state checkpoints (kv/checkpoints.py): offset in this block (1..len(tokens)) -> the
    # recurrent state after the token at that offset.
    checkpoints: dict[int, SequenceState] = field(default_factory=dict)
