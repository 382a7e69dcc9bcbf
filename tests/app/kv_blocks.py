"""What the KV block store (storage/kv/store.py) holds of a conversation, as the app tests check it:
its block files under <home>/kv and the tokens of its chains, read from the conversation database."""

from __future__ import annotations

from pathlib import Path

import torch

from storage.db.conversations import ConversationStore
from storage.kv.block_file import SUFFIX
from storage.kv.index import KVIndex
from storage.kv.store import KV_DIR


def block_files(home: Path) -> dict[str, int]:
    """Every block file of the store: its name -> its size in bytes."""
    directory = Path(home) / KV_DIR
    return {p.name: p.stat().st_size for p in directory.glob(f"*{SUFFIX}")} if directory.is_dir() else {}


def stored_bytes(home: Path) -> int:
    return sum(block_files(home).values())


def conversation_kv(home: Path, conversation_id: str) -> tuple[int, list[Path]]:
    """(tokens of the longest chain the conversation keeps, 0: none; the files of its chains' blocks),
    read through a read-only open of the database, as another kvchat would see them."""
    with ConversationStore.open(Path(home), write=False) as store:
        index = KVIndex(store.database)
        heads = index.heads_of(conversation_id)
        chain = index.chain(conversation_id) if heads else set()
    return max(heads.values(), default=0), [Path(home) / KV_DIR / f"{key}{SUFFIX}" for key in sorted(chain)]


def read_back(storage, engine, token_ids: list[int]) -> tuple[int, int]:
    """(tokens of the stored chain `token_ids` start with, how many of its blocks read back intact in the
    engine's own dtype and layout): the K/V a resume in a new process would load."""
    plan = storage.kv.plan(engine.fingerprint, engine.kv_block_size, token_ids)
    shape = engine.prefix_cache.pool.data.shape[1:]
    dests = [torch.zeros(shape, dtype=engine.prefix_cache.pool.data.dtype) for _ in plan]
    tokens = sum(len(block.token_ids) for block in plan)
    return tokens, storage.kv.read(plan, dests)


def chain_paths(storage, engine, token_ids: list[int]) -> list[Path]:
    """The block files of the stored chain that `token_ids` start with, first block first."""
    return [storage.kv.path(block.key)
            for block in storage.kv.plan(engine.fingerprint, engine.kv_block_size, token_ids)]


def conversation_chain(home: Path, conversation_id: str) -> list[Path]:
    """The files of the conversation's longest chain, first block first ([]: it keeps none)."""
    with ConversationStore.open(Path(home), write=False) as store:
        index = KVIndex(store.database)
        heads = index.heads_of(conversation_id)
        if not heads:
            return []
        rows = {row.key: row for row in index.blocks_of(sorted(index.chain(conversation_id)))}
    keys, key = [], max(heads, key=heads.get)
    while key in rows:
        keys.append(key)
        key = rows[key].parent
    return [Path(home) / KV_DIR / f"{key}{SUFFIX}" for key in reversed(keys)]
