"""The trash: a deleted conversation is kept for TRASH_KEEP_S, with its K/V on disk, and can be restored.

`delete` in the chat or on the command line moves a conversation here (conversations.deleted_at);
it leaves the sidebar, `list`, `search` and the input's history, and takes no more messages. `kvchat
list --deleted` shows the trash and `kvchat restore ID` brings one back as it was. A writable open
empties the trash of conversations deleted over TRASH_KEEP_S ago, for good (storage/purge.py, which
also removes the K/V blocks only they kept).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from storage.db.database import ConversationDatabase
from storage.db.records import CONVERSATION_COLUMNS, Conversation, conversation_from_row
from storage.errors import StorageError

TRASH_KEEP_S = 30 * 24 * 3600.0  # 30 days


class Trash:
    """The trash of a ConversationStore, over its database; ConversationStore.trash(), restore() and
    trashed() are the doors the app uses."""

    def __init__(self, database: ConversationDatabase, resolve_id: Callable[..., str]):
        """`resolve_id(id_or_prefix, trashed=False)`: the store's (ConversationStore.resolve_id), so an id
        prefix means the same conversation here as everywhere else."""
        self.database = database
        self.resolve_id = resolve_id

    def put(self, conversation_id: str) -> Conversation:
        """Move the conversation to the trash; returns it (as it was)."""
        with self.database.write("the deletion"):
            full_id = self.resolve_id(conversation_id)
            rows = self.database.rows(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", [full_id])
            self.database.db.execute("UPDATE conversations SET deleted_at = ? WHERE id = ?", [time.time(), full_id])
        return conversation_from_row(rows[0])

    def restore(self, conversation_id: str) -> Conversation:
        """Take the conversation out of the trash, as it was; returns it."""
        with self.database.write("the restored conversation"):
            full_id = self.resolve_id(conversation_id, trashed=True)
            self.database.db.execute("UPDATE conversations SET deleted_at = NULL WHERE id = ?", [full_id])
        rows = self.database.rows(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", [full_id])
        if not rows:  # deleted by another process just now
            raise StorageError(f"No conversation matches '{conversation_id}'.")
        return conversation_from_row(rows[0])

    def conversations(self) -> list[Conversation]:
        """The conversations in the trash, most recently deleted first."""
        rows = self.database.rows(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE deleted_at IS NOT NULL"
                                  " ORDER BY deleted_at DESC, id")
        return [conversation_from_row(row) for row in rows]

    def expired(self, older_than_s: float = TRASH_KEEP_S) -> list[str]:
        """The ids of the conversations in the trash for over `older_than_s`."""
        cutoff = time.time() - older_than_s
        return [row["id"] for row in self.database.rows(
            "SELECT id FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at < ?", [cutoff])]

    def purge(self, older_than_s: float = TRASH_KEEP_S) -> list[str]:
        """Delete for good the conversations in the trash for over `older_than_s`; returns their ids."""
        expired = self.expired(older_than_s)
        for conversation_id in expired:  # as ConversationStore.delete(trashed=True): messages go by cascade
            with self.database.write("the deletion"):
                self.database.db.execute("DELETE FROM conversations WHERE id = ?",
                                         [self.resolve_id(conversation_id, trashed=True)])
        return expired

