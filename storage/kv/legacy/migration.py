"""Snapshot files of an older kvchat (snapshots/<conversation id>.safetensors) moved into the block store.

Each file is read and verified as before (snapshots.py), its K/V written into
the block store as the conversation's chain, and only then removed, so a
crash in between leaves the file to migrate again (its blocks already stored
are not written twice). A file that cannot be used (damaged, another format
version, its conversation gone or in the trash) is removed with one log line.
Nothing is left behind: the directory itself goes once it is empty.

When the store opens, each file's `migrate_one` is queued on the background
writer (app/chat/saved/conversation.py), one job each, so a turn's own writes go
between them and quitting waits for one file at most (the rest are migrated
at the next start); a resume that needs one conversation's file first calls
`migrate_one` for it, which waits for nothing but the same lock.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from storage.errors import StorageError
from storage.kv.legacy.snapshot_dir import SnapshotRejected
from storage.kv.legacy.snapshots import SnapshotStore
from storage.kv.store import KVBlockStore

log = logging.getLogger("kvchat")


class SnapshotMigration:
    def __init__(self, home: Path, kv: KVBlockStore, conversation_alive):
        """`conversation_alive(id)`: whether the conversation exists and is not in the trash."""
        self.legacy = SnapshotStore(home)  # opening it removes dead writers' temp files
        self.kv = kv
        self.alive = conversation_alive
        self._lock = threading.Lock()

    def pending(self) -> list[str]:
        """The conversation ids that still have a snapshot file."""
        return self.legacy.conversation_ids()

    def remove_dir(self) -> None:
        """Remove the old snapshot directory once it is empty (temp files of a live older kvchat keep it)."""
        try:
            self.legacy.dir.rmdir()
        except OSError:
            pass

    def migrate_one(self, conversation_id: str) -> bool:
        """Move one conversation's snapshot file into the block store (True), or discard it. Never raises:
        a failure to write (a full disk) leaves the file for the next try."""
        if not self.kv.writable:
            return False
        with self._lock:
            try:
                snapshot = self.legacy.read(conversation_id, None, None)
            except SnapshotRejected as exc:  # a damaged file is removed by load; any other unusable one here
                log.warning("kvchat: the old KV snapshot of conversation %s was discarded: %s", conversation_id, exc)
                self.legacy.delete(conversation_id)
                return False
            except OSError:
                return False
            if snapshot is None:
                return False
            moved = False
            try:
                if not self.alive(conversation_id):
                    log.info("kvchat: the old KV snapshot of conversation %s was discarded: the conversation "
                             "is deleted or in the trash", conversation_id)
                else:
                    self.kv.save(conversation_id, snapshot)
                    moved = True
            except (OSError, StorageError) as exc:
                log.warning("kvchat: the old KV snapshot of conversation %s was not moved to the block store yet "
                            "(%s)", conversation_id, exc)
                return False
            finally:
                del snapshot  # the mapping of the file, before the file goes
            self.legacy.delete(conversation_id)
            return moved
