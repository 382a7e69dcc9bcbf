"""What kvchat keeps on disk and how big it is: the conversation database and its backups, the K/V block
store, and the model caches (GGUF tokenizers, synthetic models, file hashes, compiled kernels). `kvchat storage` prints it (app/cli/storage_usage.py), the chat's settings
panel shows its one line.

Disk use was invisible: 13 small chats held 571 MB of stored K/V next to a 623 MB converted model (GGUF
files are now read in place: no converted model is kept).
Sizes are read from the file system; the database is read (read-only) for the trash count and for how
much of the KV block store conversations share (blocks stored once, referenced by several).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.paths import GGUF_TOKENIZERS_FOLDER as GGUF_TOKENIZERS
from engine.paths import TOKENIZER_SNAPSHOTS_FOLDER
from engine.paths import cache_dir
from storage.data_dir import data_dir
from storage.db.conversations import ConversationStore
from storage.disk_files import DEFAULT_KV_DISK_GB
from storage.errors import StorageError
from storage.kv.keys import CHECKPOINT_SUFFIX, SUFFIX
from storage.kv.store import KV_DIR, KVBlockStore


@dataclass(frozen=True)
class Usage:
    database_bytes: int  # kvchat.db with its -wal and -shm
    backup_bytes: int
    backups: int
    kv_bytes: int  # the KV block store (temp files of writers still running included) and old snapshot files
    kv_blocks: int
    kv_conversations: int  # conversations with K/V in the store
    kv_shared_bytes: int  # blocks two or more conversations (or branches' conversations) reference
    kv_saved_bytes: int  # what storing those once saves over a copy per conversation
    kv_cap_bytes: int
    model_cache_bytes: int  # GGUF tokenizer caches, synthetic models, file hashes and compiled kernels
    models: int  # models with a cache: GGUF tokenizer caches and synthetic models
    trashed: int  # conversations in the trash
    data_dir: str
    cache_dir: str
    kv_checkpoints: int = 0  # a hybrid model's state checkpoints beside the blocks (their bytes are in kv_bytes)

    @property
    def total_bytes(self) -> int:
        return self.database_bytes + self.backup_bytes + self.kv_bytes + self.model_cache_bytes


def _size(path: Path) -> tuple[int, int]:
    """Bytes under `path` (a file or a folder, links not followed) and how many top-level entries it has."""
    if path.is_file() and not path.is_symlink():
        return path.stat().st_size, 1
    total, entries = 0, 0
    if not path.is_dir() or path.is_symlink():
        return 0, 0
    for entry in os.scandir(path):
        entries += 1
        if entry.is_dir(follow_symlinks=False):
            total += _size(Path(entry.path))[0]
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total, entries


def _block_files(folder: Path, suffix: str = SUFFIX) -> int:
    """How many block files `folder` holds: regular files named <key>.kvb (not a folder in a block's place,
    one moved aside, or a writer's temp file); `suffix` CHECKPOINT_SUFFIX: checkpoint files, <key>.kvs."""
    try:
        return sum(1 for entry in os.scandir(folder)
                   if entry.name.endswith(suffix) and entry.is_file(follow_symlinks=False))
    except OSError:
        return 0


def usage(kv_disk_gb: float | None = None) -> Usage:
    home, cache = data_dir(), cache_dir()
    database = sum(_size(home / f"kvchat.db{suffix}")[0] for suffix in ("", "-wal", "-shm"))
    backup_bytes, backups = _size(home / "backups")
    kv_bytes = _size(home / KV_DIR)[0]
    kv_blocks, kv_checkpoints = _block_files(home / KV_DIR), _block_files(home / KV_DIR, CHECKPOINT_SUFFIX)
    kv_bytes += _size(home / "snapshots")[0]  # an older kvchat's snapshot files, until they are migrated
    model_bytes, models = _size(cache / "models")
    tokenizer_bytes, tokenizers = _size(cache / GGUF_TOKENIZERS)
    model_bytes += tokenizer_bytes + sum(_size(cache / name)[0] for name in ("file-hashes", "kernels", TOKENIZER_SNAPSHOTS_FOLDER))
    models += tokenizers
    trashed, conversations, shared, saved = 0, 0, 0, 0
    if (home / "kvchat.db").is_file():
        with ConversationStore.open(home, write=False) as store:
            trashed = len(store.trashed())
            try:  # read-only: the store neither cleans nor writes
                stats = KVBlockStore(home, store.database, cap_bytes=0).stats()
                conversations, shared, saved = stats.conversations, stats.shared_bytes, stats.saved_bytes
            except StorageError:  # a database an older kvchat made, not migrated yet: no block store in it
                pass
    cap = int((DEFAULT_KV_DISK_GB if kv_disk_gb is None else kv_disk_gb) * 1e9)
    return Usage(database, backup_bytes, backups, kv_bytes, kv_blocks, conversations, shared, saved, cap,
                 model_bytes, models, trashed, str(home), str(cache), kv_checkpoints)


def human(n: int) -> str:
    """571 MB, 94.4 MB, 1.2 GB: three figures at most."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.0f} {unit}" if n >= 100 * size else f"{n / size:.1f} {unit}"
    return f"{n} B"


def one_line(u: Usage) -> str:
    """For the chat: "disk: KV 571 MB/4.0 GB · db 1.2 MB · models 623 MB"."""
    return (f"disk: KV {human(u.kv_bytes)}/{human(u.kv_cap_bytes)} · db "
            f"{human(u.database_bytes + u.backup_bytes)} · models {human(u.model_cache_bytes)}")
