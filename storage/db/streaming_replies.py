"""A reply while it streams: its row, the parts appended to it, and what becomes of them.

A streaming reply is one `messages` row (status 'streaming', its writer's pid)
plus, in `stream_parts`, the text and token ids it added since that row was
written, in order. Saving the reply so far appends one part with only the new
text: one page of the write-ahead log however long the reply is, where
rewriting the row (and reindexing it for search) copied the whole reply at
every save (about 26 KB a save for a 400-token reply: that is what filled a
nearly full disk). The parts are folded back into the row when the reply ends
(`finish_reply`) or, if its writer died, when a later kvchat recovers it
(`recover_interrupted`). Readers see a streaming row's text followed by its
parts (`read_back`), and a streaming reply whose writer is gone as
interrupted, even where the recovery could not write (a read-only folder).
The search index covers a message once it no longer streams (migration 0007).

Saving a part is written with ConversationDatabase.write_retrying: on a full
disk the write-ahead log starts over and the write is tried once more.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence

from storage.db.database import ConversationDatabase
from storage.db.records import StoredMessage, decode_token_ids, encode_token_ids
from storage.errors import StorageError

# A streaming reply not written for this long is dead even if its writer's pid is alive:
# the writer saves it about twice a second, so the pid now belongs to another process.
STALE_STREAM_S = 3600.0


class ReplyGone(StorageError):
    """The reply (or its whole conversation) was deleted or moved to the trash, or finished elsewhere,
    while it was written."""


def process_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill(pid, 0) would terminate it; rely on STALE_STREAM_S there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


class StreamingReplies:
    """The streaming replies of one conversation database."""

    def __init__(self, database: ConversationDatabase):
        self.database = database

    def append_to_reply(self, message_id: str, text: str, token_ids: Sequence[int]) -> None:
        """Add `text` and `token_ids` to the streaming reply `message_id`, writing only them.
        ReplyGone if the reply no longer streams (deleted with its conversation, or finished)."""
        params = {"id": message_id, "text": text, "ids": encode_token_ids(token_ids), "now": time.time()}

        def append() -> None:
            added = self.database.db.execute(
                "INSERT INTO stream_parts (message_id, seq, text, token_ids, created_at)"
                " SELECT id, (SELECT coalesce(max(seq) + 1, 0) FROM stream_parts WHERE message_id = :id),"
                " :text, :ids, :now FROM messages WHERE id = :id AND status = 'streaming'"
                " AND conversation_id IN (SELECT id FROM conversations WHERE deleted_at IS NULL)", params).rowcount
            if not added:
                raise ReplyGone(f"The reply {message_id} was deleted while it was being written.")

        self.database.write_retrying("the reply so far", append)

    def finish_reply(self, message_id: str, *, text: str, token_ids: Sequence[int], status: str,
                     stats: dict | None, tools: dict | None = None) -> None:
        """The reply's final row (its whole text and ids, status, stats, the tool calls it made); its parts
        are dropped and its conversation becomes the most recently active. ReplyGone if it was deleted
        meanwhile."""
        import json

        now = time.time()

        def finish() -> None:
            changed = self.database.db.execute(
                "UPDATE messages SET text = ?, token_ids = ?, status = ?, stats = ?, finish_reason = ?,"
                " tools = ?, updated_at = ? WHERE id = ?"
                " AND conversation_id IN (SELECT id FROM conversations WHERE deleted_at IS NULL)",
                [text, encode_token_ids(token_ids), status, None if stats is None else json.dumps(stats),
                 (stats or {}).get("finish_reason"), None if tools is None else json.dumps(tools, ensure_ascii=False),
                 now, message_id]).rowcount
            if not changed:
                raise ReplyGone(f"The reply {message_id} was deleted while it was being written.")
            self.database.db.execute("DELETE FROM stream_parts WHERE message_id = ?", [message_id])
            self.database.db.execute("UPDATE conversations SET updated_at = ? WHERE id = "
                                     "(SELECT conversation_id FROM messages WHERE id = ?)", [now, message_id])

        self.database.write_retrying("the reply", finish)

    def read_back(self, messages: list[StoredMessage]) -> list[StoredMessage]:
        """`messages` as readers see them: a streaming reply with its parts after its row's text (and
        its last part's time as updated_at), and as interrupted if its writer is gone."""
        streaming = [m.id for m in messages if m.status == "streaming"]
        if not streaming:
            return messages
        marks = ", ".join("?" * len(streaming))
        parts: dict[str, list[dict]] = {}
        for row in self.database.rows(f"SELECT message_id, text, token_ids, created_at FROM stream_parts"
                                      f" WHERE message_id IN ({marks}) ORDER BY message_id, seq", streaming):
            parts.setdefault(row["message_id"], []).append(row)
        return [self._with_parts(m, parts.get(m.id, [])) if m.status == "streaming" else m for m in messages]

    @staticmethod
    def _with_parts(message: StoredMessage, parts: list[dict]) -> StoredMessage:
        text = message.text + "".join(p["text"] for p in parts)
        ids = message.token_ids + [i for p in parts for i in decode_token_ids(p["token_ids"])]
        updated = max([message.updated_at, *(p["created_at"] for p in parts)])
        dead = message.writer_pid is None or updated < time.time() - STALE_STREAM_S \
            or not process_alive(message.writer_pid)
        return dataclasses.replace(message, text=text, token_ids=ids, updated_at=updated,
                                   status="interrupted" if dead else "streaming")

    def recover_interrupted(self) -> int:
        """Fold the parts of streaming replies whose writer is gone (or silent for STALE_STREAM_S) into
        their rows and mark them `interrupted`, text kept; those of a live kvchat are left alone.
        Returns how many. Reads first, so a database with nothing to recover is never written."""
        from storage.db.records import MESSAGE_COLUMNS, message_from_row

        rows = self.database.rows(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE messages.status = 'streaming'")
        dead = [m for m in self.read_back([message_from_row(row) for row in rows]) if m.status == "interrupted"]
        if not dead:
            return 0
        now = time.time()
        with self.database.write("the recovery of interrupted replies"):
            for message in dead:  # only rows still streaming: another kvchat may have recovered them meanwhile
                self.database.db.execute(
                    "UPDATE messages SET text = ?, token_ids = ?, status = 'interrupted', updated_at = ?"
                    " WHERE id = ? AND status = 'streaming'",
                    [message.text, encode_token_ids(message.token_ids), now, message.id])
                self.database.db.execute("DELETE FROM stream_parts WHERE message_id = ?", [message.id])
        return len(dead)
