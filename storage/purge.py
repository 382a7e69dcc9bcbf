"""Emptying the trash for good: the one place that composes the conversation database's trash
(storage/db/trash.py) with the K/V block store (storage/kv/store.py), so neither reaches into the other."""

from __future__ import annotations

from pathlib import Path

from storage.db.conversations import ConversationStore
from storage.db.trash import TRASH_KEEP_S
from storage.db.turn_lock import TurnLock
from storage.errors import StorageError
from storage.kv.store import KVBlockStore


def empty_trash(store: ConversationStore, home: Path, kv: KVBlockStore | None = None,
                older_than_s: float = TRASH_KEEP_S) -> int:
    """Purge the trash's expired conversations with their turn locks, and the K/V blocks (of the block
    store `kv`, default: the one in `home`) no other conversation shares; how many went. A failure (a
    busy or full database) leaves them for the next start."""
    kv = kv if kv is not None else KVBlockStore(home, store.database, cap_bytes=0)
    try:
        chains = {c: kv.index.chain(c) for c in store.trash_bin.expired(older_than_s)}
        expired = store.trash_bin.purge(older_than_s)
        kv.remove_unreferenced(set().union(*(chains.get(c, set()) for c in expired)))
    except StorageError:
        return 0
    for conversation_id in expired:
        TurnLock(home, conversation_id).remove_file()
    return len(expired)
