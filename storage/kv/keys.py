"""KV block keys: a block's key chains its parent's key, the model fingerprint and its token ids.

A hybrid model's state checkpoint after position p is keyed on the same chain: by the key a block
ending at p would have (its block's parent and the tokens from the block's start to p; at a block's
end, that block's own key). So it does not depend on the tokens after p: the longer block that
supersedes a turn's last, partial one holds it still, and conversations that part within the block
after p share it.

Plain Python (hashlib, struct): the database index and the commands that only list or delete use
keys without loading numpy or torch. The file format built on them: block_file.py.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

SUFFIX = ".kvb"  # a block's file: <key>.kvb
CHECKPOINT_SUFFIX = ".kvs"  # a state checkpoint's file: <key>.kvs
ROOT = ""  # the parent key of a sequence's first block


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32, as the block files and the index keep them."""
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def token_ids_of(blob: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(blob) // 4}I", blob)


def block_key(parent: str, fingerprint: str, token_ids) -> str:
    """The key of a block holding `token_ids` after the block `parent` (ROOT: the first block)."""
    h = hashlib.sha256()
    h.update(bytes.fromhex(parent) if parent else bytes(32))
    h.update(fingerprint.encode())
    h.update(token_bytes(token_ids))
    return h.hexdigest()


def chain_keys(fingerprint: str, token_ids, block_size: int) -> list[str]:
    """The keys of the blocks of `token_ids` (the last one partial if they do not fill it)."""
    keys, parent = [], ROOT
    for start in range(0, len(token_ids), block_size):
        parent = block_key(parent, fingerprint, token_ids[start : start + block_size])
        keys.append(parent)
    return keys


def checkpoint_place(fingerprint: str, keys: Sequence[str], token_ids, position: int,
                     block_size: int) -> tuple[str, str, tuple[int, ...]]:
    """Where the checkpoint after `position` tokens of `token_ids` (whose chain keys are `keys`, those of
    the blocks before its at least) is kept: (its key, the key of the block before the one holding its
    last token (ROOT: none), the tokens from that block's start to it)."""
    index = (position - 1) // block_size
    parent = keys[index - 1] if index else ROOT
    tokens = tuple(token_ids[index * block_size : position])
    return block_key(parent, fingerprint, tokens), parent, tokens
