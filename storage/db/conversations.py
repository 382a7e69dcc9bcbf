"""Saved conversations: each one a tree of messages (edits and regenerations are siblings under
the same parent) with the token ids that produced them, and full-text search over the text."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from sqlite_utils import Database

import storage.data_dir
from storage.db.database import ConversationDatabase
from storage.db.open import open_database
from storage.db.records import (  # Conversation and StoredMessage are this module's public types too
    CONVERSATION_COLUMNS, MESSAGE_COLUMNS, ROLES, STATUSES, Conversation, SearchHit, StoredMessage,
    conversation_from_row, encode_token_ids, fts_query, message_from_row, title_from,
)
from storage.db.streaming_replies import StreamingReplies
from storage.db.trash import Trash
from storage.errors import StorageError

MIN_PREFIX = 4  # shortest conversation id prefix accepted

_NOT_GIVEN = object()  # "leave unchanged"; None is a value (no system prompt, no stats)


# The path from a message up to its root, as (id, depth) rows; one indexed lookup per level.
_ANCESTORS = """
WITH RECURSIVE path(id, depth) AS (
    SELECT id, 0 FROM messages WHERE id = :leaf AND conversation_id = :conversation
    UNION ALL
    SELECT messages.parent_id, path.depth + 1 FROM messages JOIN path ON messages.id = path.id
    WHERE messages.parent_id IS NOT NULL
)"""

_DESCENDANTS = """
WITH RECURSIVE below(id) AS (
    VALUES (:message)
    UNION ALL
    SELECT messages.id FROM messages JOIN below ON messages.parent_id = below.id
)"""


class ConversationStore:
    """Conversations in one SQLite database. Every method taking a conversation id also takes a
    unique prefix of it (at least MIN_PREFIX characters). Safe to share between threads, and
    between processes on one database.

    Composed over one ConversationDatabase (`database`): the streaming replies (`replies`) and the
    trash (`trash_bin`, whose doors are trash(), restore() and trashed()) use the same connection
    and lock; so does the K/V block store's index (storage/kv/index.py), which the store does not hold."""

    def __init__(self, db: Database, read_only_reason: str | None = None):
        self.database = ConversationDatabase(db, read_only_reason)
        self.db = db
        self.replies = StreamingReplies(self.database)
        self.trash_bin = Trash(self.database, self.resolve_id)

    @property
    def read_only_reason(self) -> str | None:
        """None: writes allowed; otherwise the one sentence every write raises (ConversationDatabase)."""
        return self.database.read_only_reason

    @read_only_reason.setter
    def read_only_reason(self, reason: str | None) -> None:
        self.database.read_only_reason = reason

    @classmethod
    def open(cls, data_dir: Path | None = None, *, write: bool = True) -> ConversationStore:
        """The store in `data_dir`/kvchat.db (default: the kvchat data dir).

        write=True (the chat, `kvchat ask`, delete, rename): the file is checked, migrated and
        backed up daily (storage/db/open.py), and replies whose writer died are marked interrupted.
        It may still come up read-only (a damaged file, a read-only folder): `read_only_reason`
        says why, before any work the user would lose. write=False (list, show, search, export):
        read-only, nothing written, so another kvchat's lock cannot stop it."""
        path = (data_dir or storage.data_dir.data_dir()) / "kvchat.db"
        opened = open_database(path, write=write)
        store = cls(opened.db, opened.read_only_reason)
        if store.read_only_reason is None:
            try:
                store.replies.recover_interrupted()
            except StorageError as error:
                # Busy, full, read-only: readers show such a reply as interrupted anyway, and the
                # next open tries again; the conversations must still open.
                logging.getLogger("kvchat").warning("Interrupted replies were not marked: %s", error)
            except BaseException:
                store.close()
                raise
        return store

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _update(self, table: str, row_id: str, changes: dict) -> int:
        """Set the columns in `changes` (names from our code, never from the user) of row `row_id`;
        returns how many rows there were (0 or 1)."""
        assignments = ", ".join(f"{column} = ?" for column in changes)
        return self.db.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", [*changes.values(), row_id]).rowcount

    # Conversations

    def resolve_id(self, id_or_prefix: str, trashed: bool = False) -> str:
        """The full id of the one conversation whose id starts with `id_or_prefix`: among those not
        deleted, or (`trashed`) among those in the trash."""
        prefix = id_or_prefix.strip().lower()
        shown = repr(id_or_prefix) if len(id_or_prefix) <= 40 else repr(id_or_prefix[:39]) + "…"  # not 100 KB back
        if len(prefix) < MIN_PREFIX:
            raise StorageError(f"{shown} is too short; give at least {MIN_PREFIX} characters of the id.")
        # Only hex can match, and it is safe inside a GLOB pattern (which can use the index).
        hex_prefix = re.fullmatch(r"[0-9a-f]+", prefix)
        rows = (self.database.rows("SELECT id, deleted_at FROM conversations WHERE id GLOB ?", [prefix + "*"])
                if hex_prefix else [])
        wanted = [row for row in rows if (row["deleted_at"] is not None) == trashed]
        if not wanted and rows and not trashed:
            raise StorageError(f"Conversation {rows[0]['id']} is in the trash; `kvchat restore {rows[0]['id']}` "
                               "brings it back.")
        rows = wanted
        if not rows:
            raise StorageError(f"No conversation {'in the trash ' if trashed else ''}matches {shown}.")
        if len(rows) > 1:
            raise StorageError(f"{shown} matches {len(rows)} conversations; give more of the id.")
        return rows[0]["id"]

    def create(self, model: str, system: str | None = None, params: dict | None = None,
               title: str = "") -> Conversation:
        now = time.time()
        conversation = Conversation(
            id=secrets.token_hex(6), title=title, model=model, system=system, params=dict(params or {}),
            token_fingerprint=None, active_leaf=None, created_at=now, updated_at=now,
        )
        with self.database.write("the new conversation"):
            self.db.execute(
                "INSERT INTO conversations (id, title, model, system, params, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [conversation.id, title, model, system, json.dumps(conversation.params), now, now],
            )
        return conversation

    def get(self, conversation_id: str) -> Conversation:
        full_id = self.resolve_id(conversation_id)
        rows = self.database.rows(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", [full_id])
        if not rows:  # deleted by another process just now
            raise StorageError(f"No conversation matches '{conversation_id}'.")
        return conversation_from_row(rows[0])

    def exists(self, conversation_id: str) -> bool:
        """Whether the conversation (its full id) is still there and not in the trash: another kvchat
        may have deleted it."""
        return bool(self.database.rows("SELECT 1 FROM conversations WHERE id = ? AND deleted_at IS NULL",
                                       [conversation_id]))

    def data_version(self) -> int:
        """A number that changes when another connection (another kvchat, the CLI) has changed the
        database since this one last looked (SQLite's PRAGMA data_version): a cheap "should the list be
        read again?" for a window left open."""
        return self.database.rows("PRAGMA data_version")[0]["data_version"]

    def list(self, limit: int | None = None, offset: int = 0) -> list[Conversation]:
        """Newest activity first. Reads only the conversations table, so it stays instant with
        thousands of long conversations."""
        rows = self.database.rows(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE deleted_at IS NULL"
            " ORDER BY updated_at DESC, id LIMIT ? OFFSET ?",
            [-1 if limit is None else limit, offset],
        )
        return [conversation_from_row(row) for row in rows]

    def rename(self, conversation_id: str, title: str) -> None:
        with self.database.write("the new title"):
            self._update("conversations", self.resolve_id(conversation_id), {"title": title.strip()})

    def update_settings(self, conversation_id: str, *, model: str = _NOT_GIVEN, system: str | None = _NOT_GIVEN,
                        params: dict = _NOT_GIVEN, token_fingerprint: str | None = _NOT_GIVEN,
                        chat_format: str | None = _NOT_GIVEN) -> None:
        """Change only the settings given."""
        changes = {"model": model, "system": system, "token_fingerprint": token_fingerprint,
                   "chat_format": chat_format}
        changes = {column: value for column, value in changes.items() if value is not _NOT_GIVEN}
        if params is not _NOT_GIVEN:
            changes["params"] = json.dumps(params)
        with self.database.write("the conversation settings"):
            full_id = self.resolve_id(conversation_id)
            if changes:
                self._update("conversations", full_id, changes)

    def trash(self, conversation_id: str) -> Conversation:
        """Move the conversation to the trash (storage/db/trash.py); returns it (as it was)."""
        return self.trash_bin.put(conversation_id)

    def restore(self, conversation_id: str) -> Conversation:
        """Take the conversation out of the trash, as it was; returns it."""
        return self.trash_bin.restore(conversation_id)

    def trashed(self) -> list[Conversation]:
        """The conversations in the trash, most recently deleted first."""
        return self.trash_bin.conversations()

    def delete(self, conversation_id: str, trashed: bool = False) -> None:
        """The conversation, its messages and their search entries, for good (foreign key cascade +
        triggers); `trashed`: one in the trash. Moving it to the trash instead: trash()."""
        with self.database.write("the deletion"):
            self.db.execute("DELETE FROM conversations WHERE id = ?", [self.resolve_id(conversation_id, trashed)])

    # Messages

    def add_message(self, conversation_id: str, parent_id: str | None, role: str, text: str, token_start: int,
                    token_ids: Sequence[int], status: str = "complete", stats: dict | None = None,
                    tools: dict | None = None) -> StoredMessage:
        """Store a message under `parent_id` and make it the conversation's active leaf. The first
        user message also titles an untitled conversation."""
        if role not in ROLES or status not in STATUSES:
            raise ValueError(f"role must be one of {ROLES} and status one of {STATUSES}, not {role!r}, {status!r}")
        now = time.time()
        writer_pid = os.getpid() if status == "streaming" else None
        with self.database.write("the message"):
            full_id = self.resolve_id(conversation_id)
            if parent_id is not None:
                self._require_message(full_id, parent_id)
            message = StoredMessage(
                id=secrets.token_hex(6), conversation_id=full_id, parent_id=parent_id, role=role, text=text,
                token_start=token_start, token_ids=list(token_ids), status=status, stats=stats,
                writer_pid=writer_pid, created_at=now, updated_at=now, tools=tools,
            )
            self.db.execute(
                "INSERT INTO messages (id, conversation_id, parent_id, role, text, token_start, token_ids, status,"
                " stats, finish_reason, writer_pid, created_at, updated_at, tools)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [message.id, full_id, parent_id, role, text, token_start, encode_token_ids(message.token_ids),
                 status, _json_or_null(stats), (stats or {}).get("finish_reason"), writer_pid, now, now,
                 _json_or_null(tools)],
            )
            self._update("conversations", full_id, {"active_leaf": message.id, "updated_at": now})
            if role == "user":
                self.db.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ''",
                                [title_from(text), full_id])
        return message

    def update_message(self, message_id: str, *, text: str = _NOT_GIVEN, token_ids: Sequence[int] = _NOT_GIVEN,
                       status: str = _NOT_GIVEN, stats: dict | None = _NOT_GIVEN) -> None:
        """Change only the fields given; with none, just mark the message (and its conversation)
        as updated now, which is a streaming reply's heartbeat."""
        if status is not _NOT_GIVEN and status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        now = time.time()
        changes: dict = {"updated_at": now}
        if text is not _NOT_GIVEN:
            changes["text"] = text
        if token_ids is not _NOT_GIVEN:
            changes["token_ids"] = encode_token_ids(token_ids)
        if status is not _NOT_GIVEN:
            changes["status"] = status
            if status == "streaming":
                changes["writer_pid"] = os.getpid()
        if stats is not _NOT_GIVEN:
            changes["stats"] = _json_or_null(stats)
            changes["finish_reason"] = (stats or {}).get("finish_reason")
        with self.database.write("the message"):
            if not self._update("messages", message_id, changes):
                raise StorageError(f"No message has the id '{message_id}'.")
            if text is not _NOT_GIVEN:  # the whole text: what a streaming reply appended is in it
                self.db.execute("DELETE FROM stream_parts WHERE message_id = ?", [message_id])
            self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = "
                            "(SELECT conversation_id FROM messages WHERE id = ?)", [now, message_id])

    def message(self, message_id: str) -> StoredMessage:
        rows = self.database.rows(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", [message_id])
        if not rows:
            raise StorageError(f"No message has the id '{message_id}'.")
        return self.replies.read_back([message_from_row(rows[0])])[0]

    def _require_message(self, conversation_id: str, message_id: str) -> None:
        if not self.database.rows("SELECT 1 FROM messages WHERE id = ? AND conversation_id = ?",
                                  [message_id, conversation_id]):
            raise StorageError(f"Message '{message_id}' is not in conversation {conversation_id}.")

    # Branches

    def branch(self, conversation_id: str, leaf: str | None = None) -> list[StoredMessage]:
        """The messages from the root down to `leaf` (default: the active leaf), in one query."""
        full_id = self.resolve_id(conversation_id)
        if leaf is None:
            leaf = self.database.rows("SELECT active_leaf FROM conversations WHERE id = ?", [full_id])[0]["active_leaf"]
            if leaf is None:
                return []
        rows = self.database.rows(
            f"{_ANCESTORS} SELECT {MESSAGE_COLUMNS} FROM path JOIN messages ON messages.id = path.id"
            " ORDER BY path.depth DESC",
            {"leaf": leaf, "conversation": full_id},
        )
        if not rows:
            raise StorageError(f"Message '{leaf}' is not in conversation {full_id}.")
        return self.replies.read_back([message_from_row(row) for row in rows])

    def all_messages(self, conversation_id: str) -> list[StoredMessage]:
        """Every message of every branch, oldest first (so each parent before its children)."""
        rows = self.database.rows(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY created_at, seq",
            [self.resolve_id(conversation_id)],
        )
        return self.replies.read_back([message_from_row(row) for row in rows])

    def children(self, message_id: str) -> list[StoredMessage]:
        """The replies to a message, and their edits and regenerations, oldest first."""
        rows = self.database.rows(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE parent_id = ? ORDER BY created_at, seq", [message_id]
        )
        return self.replies.read_back([message_from_row(row) for row in rows])

    def siblings(self, message_id: str) -> list[StoredMessage]:
        """The message and the others under the same parent (its edits or regenerations), oldest
        first. Unlike children(), this also covers edits of a conversation's first message."""
        rows = self.database.rows(
            f"SELECT {MESSAGE_COLUMNS} FROM messages JOIN messages AS this ON this.id = ?"
            " WHERE messages.conversation_id = this.conversation_id AND messages.parent_id IS this.parent_id"
            " ORDER BY messages.created_at, messages.seq",
            [message_id],
        )
        return self.replies.read_back([message_from_row(row) for row in rows])

    def sibling_ids(self, message_id: str) -> list[str]:
        """siblings() as ids only: what the chat view needs to show "2/3" on a message."""
        rows = self.database.rows(
            "SELECT messages.id FROM messages JOIN messages AS this ON this.id = ?"
            " WHERE messages.conversation_id = this.conversation_id AND messages.parent_id IS this.parent_id"
            " ORDER BY messages.created_at, messages.seq",
            [message_id],
        )
        return [row["id"] for row in rows]

    def latest_leaf(self, message_id: str) -> str:
        """The id of the most recently updated message without children at or below `message_id`:
        where a switch to that branch should land."""
        rows = self.database.rows(
            f"{_DESCENDANTS} SELECT messages.id FROM below JOIN messages ON messages.id = below.id"
            " WHERE NOT EXISTS (SELECT 1 FROM messages AS child WHERE child.parent_id = messages.id)"
            " ORDER BY messages.updated_at DESC, messages.seq DESC LIMIT 1",
            {"message": message_id},
        )
        if not rows:
            raise StorageError(f"No message has the id '{message_id}'.")
        return rows[0]["id"]

    def set_active_leaf(self, conversation_id: str, message_id: str) -> None:
        """Show the branch ending at `message_id`. Not activity: the conversation keeps its place."""
        with self.database.write("the branch choice"):
            full_id = self.resolve_id(conversation_id)
            self._require_message(full_id, message_id)
            self._update("conversations", full_id, {"active_leaf": message_id})

    # Search and the input's history

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Messages containing every word of `text` (any characters; none has a special meaning),
        most relevant first, then newest."""
        query = fts_query(text)
        if not query:
            return []
        rows = self.database.rows(
            "SELECT messages.conversation_id, conversations.title, messages.id AS message_id, messages.role,"
            " snippet(messages_fts, 0, '', '', '…', 12) AS snippet"
            " FROM messages_fts"
            " JOIN messages ON messages.seq = messages_fts.rowid"
            " JOIN conversations ON conversations.id = messages.conversation_id"
            " WHERE messages_fts MATCH ? AND conversations.deleted_at IS NULL"
            " ORDER BY messages_fts.rank, messages.updated_at DESC LIMIT ?",
            [query, limit],
        )
        return [SearchHit(**row) for row in rows]

    def recent_prompts(self, limit: int = 100) -> list[str]:
        """The texts of the latest `limit` user messages of all conversations, oldest first, as the
        chat input's history; a text sent again right after itself is kept once (so fewer may come)."""
        rows = self.database.rows(
            "SELECT text FROM messages WHERE role = 'user' AND conversation_id NOT IN"
            " (SELECT id FROM conversations WHERE deleted_at IS NOT NULL) ORDER BY created_at DESC, seq DESC LIMIT ?",
            [limit],
        )
        texts = [row["text"] for row in reversed(rows)]
        return [text for i, text in enumerate(texts) if i == 0 or text != texts[i - 1]]


def _json_or_null(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value)
