"""The database schema as a list of small named steps, applied in order and recorded in
`_migrations`. Never edit a step that has shipped: add a new one at the end."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence

from sqlite_utils import Database
from sqlite_utils.db import ForeignKey

from storage.db.transaction import transaction
from storage.errors import StorageError


def _conversations(db: Database) -> None:
    db["conversations"].create(
        {
            "id": str,  # 12 lowercase hex characters
            "title": str,  # "" until the first user message
            "model": str,
            "system": str,  # NULL: no system prompt, the model's default applies
            "params": str,  # sampling settings, JSON object
            "active_leaf": str,  # id of the message the shown branch ends at
            "created_at": float,  # epoch seconds
            "updated_at": float,
        },
        pk="id",
        not_null={"title", "model", "params", "created_at", "updated_at"},
        defaults={"title": "", "params": "{}"},
    )
    # The sidebar lists conversations newest first.
    db["conversations"].create_index(["updated_at"])


def _messages(db: Database) -> None:
    db["messages"].create(
        {
            # An INTEGER PRIMARY KEY is the rowid, which the search index refers to; a table
            # without one may have its rowids renumbered by VACUUM.
            "seq": int,
            "id": str,  # 12 lowercase hex characters
            "conversation_id": str,
            "parent_id": str,  # NULL for the first message of a branch
            "role": str,  # system | user | assistant
            "text": str,
            "token_start": int,  # where token_ids begin in the conversation's token sequence
            "token_ids": bytes,  # little-endian int32
            "status": str,  # complete | streaming | stopped | interrupted
            "stats": str,  # JSON object (replies): ttft_ms, decode_tokens_per_s, ...
            "finish_reason": str,  # also in stats; a column so it can be queried
            "created_at": float,
            "updated_at": float,
        },
        pk="seq",
        not_null={"id", "conversation_id", "role", "text", "token_start", "token_ids", "status",
                  "created_at", "updated_at"},
        defaults={"status": "complete"},
        foreign_keys=[
            ForeignKey("messages", "conversation_id", "conversations", "id", on_delete="CASCADE"),
            ForeignKey("messages", "parent_id", "messages", "id", on_delete="CASCADE"),
        ],
    )
    db["messages"].create_index(["id"], unique=True)
    db["messages"].create_index(["conversation_id"])
    db["messages"].create_index(["parent_id"])


def _message_search(db: Database) -> None:
    # Triggers keep the index in step with every insert, update and delete (cascades too).
    db["messages"].enable_fts(["text"], create_triggers=True)


def _token_fingerprint(db: Database) -> None:
    # Which tokenizer and chat template produced the stored token ids; NULL: unknown.
    db["conversations"].add_column("token_fingerprint", str)


def _writer_pid(db: Database) -> None:
    # The process streaming a reply, so a later start can tell a live stream from a dead one.
    db["messages"].add_column("writer_pid", int)
    # Every start looks for streaming replies; this index holds only those few rows.
    db.execute("CREATE INDEX idx_messages_streaming ON messages(status) WHERE status = 'streaming'")


def _prompt_history(db: Database) -> None:
    # The chat input's history reads the newest user messages at every start (recent_prompts).
    db["messages"].create_index(["role", "created_at"])


def _stream_parts(db: Database) -> None:
    # What a streaming reply added since its row was written, appended in order (streaming_replies.py):
    # saving the reply so far writes only the new text, not the whole reply again.
    db.execute(
        "CREATE TABLE stream_parts ("
        " message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,"
        " seq INTEGER NOT NULL,"  # 0, 1, 2, ... in the order the parts were written
        " text TEXT NOT NULL,"
        " token_ids BLOB NOT NULL,"  # little-endian int32, like messages.token_ids
        " created_at REAL NOT NULL,"  # epoch seconds: the stream's heartbeat
        " PRIMARY KEY (message_id, seq)) WITHOUT ROWID"
    )
    # The search index covers a message once it is no longer streaming: a streaming row changes at
    # every save, and reindexing it each time (sqlite-utils' trigger fires on any column) wrote more
    # than the save itself. Updates of other columns (stats, updated_at) no longer touch the index.
    for trigger in ("messages_ai", "messages_ad", "messages_au"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    db.execute("INSERT INTO messages_fts (messages_fts, rowid, text) SELECT 'delete', seq, text FROM messages"
               " WHERE status = 'streaming'")
    db.execute("CREATE TRIGGER messages_ai AFTER INSERT ON messages WHEN new.status != 'streaming' BEGIN"
               " INSERT INTO messages_fts (rowid, text) VALUES (new.seq, new.text); END")
    db.execute("CREATE TRIGGER messages_ad AFTER DELETE ON messages WHEN old.status != 'streaming' BEGIN"
               " INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', old.seq, old.text); END")
    # One trigger, so the old entry always goes before the new one goes in (FTS5 forgets a row's
    # terms by the text it was given; the other order would drop the new entry's shared terms).
    db.execute("CREATE TRIGGER messages_au AFTER UPDATE OF text, status ON messages BEGIN"
               " INSERT INTO messages_fts (messages_fts, rowid, text)"
               " SELECT 'delete', old.seq, old.text WHERE old.status != 'streaming';"
               " INSERT INTO messages_fts (rowid, text) SELECT new.seq, new.text WHERE new.status != 'streaming';"
               " END")


def _trash(db: Database) -> None:
    # A deleted conversation is kept in the trash for a while (storage/db/trash.py); NULL: not deleted.
    db["conversations"].add_column("deleted_at", float)
    db.execute("CREATE INDEX idx_conversations_deleted ON conversations(deleted_at) WHERE deleted_at IS NOT NULL")


def _chat_format(db: Database) -> None:
    # The standard chat format a conversation is written in (app/chat/prompt/formats.py: "gemma", "llama3",
    # "chatml", "mistral", "transcript"), chosen for a model without a chat template of its own, so a
    # resumed conversation goes on in it. NULL: the model's own chat template.
    db["conversations"].add_column("chat_format", str)


def _kv_blocks(db: Database) -> None:
    # The KV block store's index (storage/kv/store.py): which block files exist, and which block ends each
    # conversation's saved chain (one row per branch). A conversation's rows go with it (cascade), in the
    # same transaction as its deletion, so the index never names a conversation that is gone.
    db.execute(
        "CREATE TABLE kv_blocks ("
        " key TEXT PRIMARY KEY,"  # hex SHA-256 of parent key, model fingerprint and token ids: <key>.kvb
        " parent TEXT NOT NULL,"  # '' for a sequence's first block
        " token_ids BLOB NOT NULL,"  # little-endian uint32, one block's worth or fewer
        " bytes INTEGER NOT NULL,"  # the file's size
        " last_used REAL NOT NULL) WITHOUT ROWID"  # epoch seconds: written or read; eviction takes the oldest
    )
    db.execute("CREATE INDEX idx_kv_blocks_parent ON kv_blocks(parent)")
    db.execute(
        "CREATE TABLE kv_heads ("
        " conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,"
        " key TEXT NOT NULL,"  # the last block of a chain the conversation keeps
        " tokens INTEGER NOT NULL,"  # the chain's length in tokens
        " updated_at REAL NOT NULL,"
        " PRIMARY KEY (conversation_id, key)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX idx_kv_heads_key ON kv_heads(key)")


def _kv_checkpoints(db: Database) -> None:
    # A hybrid model's state checkpoints beside the K/V blocks (storage/kv/checkpoint_file.py). A row is
    # kept while a block after `parent` starts with its tokens (one that holds its position), and goes
    # before its file is unlinked, as a block's does.
    db.execute(
        "CREATE TABLE kv_checkpoints ("
        " key TEXT PRIMARY KEY,"  # the chain key of the tokens up to it (a block ending there): <key>.kvs
        " parent TEXT NOT NULL,"  # the block before the one holding its position; '' for the first
        " token_ids BLOB NOT NULL,"  # little-endian uint32: the tokens from that block's start to it
        " bytes INTEGER NOT NULL) WITHOUT ROWID"  # the file's size
    )
    db.execute("CREATE INDEX idx_kv_checkpoints_parent ON kv_checkpoints(parent)")


def _tool_messages(db: Database) -> None:
    # Tool calling (app/tools): a reply's calls, and each call's result as a message of its own (role "tool").
    # JSON, NULL for every other message: an assistant message's {"calls": [{"id", "name", "arguments"}]}; a
    # tool message's {"call": {"id", "name", "arguments"}, "ms", "is_error", "truncated", "server"}.
    db["messages"].add_column("tools", str)


Migration = tuple[str, Callable[[Database], None]]

MIGRATIONS: list[Migration] = [
    ("0001_conversations", _conversations),
    ("0002_messages", _messages),
    ("0003_message_search", _message_search),
    ("0004_token_fingerprint", _token_fingerprint),
    ("0005_writer_pid", _writer_pid),
    ("0006_prompt_history", _prompt_history),
    ("0007_stream_parts", _stream_parts),
    ("0008_trash", _trash),
    ("0009_chat_format", _chat_format),
    ("0010_kv_blocks", _kv_blocks),
    ("0011_kv_checkpoints", _kv_checkpoints),
    ("0012_tool_messages", _tool_messages),
]


# The file's own marks, in its header: `file` and other tools tell kvchat's database from other SQLite
# files by them, and kvchat refuses a file another application marked (storage/db/identity.py).
# application_id is "kvch" in ASCII; user_version counts the steps applied (12 with the list above).
APPLICATION_ID = 0x6B766368


def marks(db: Database) -> tuple[int, int]:
    """The file's (application_id, user_version)."""
    return (db.execute("PRAGMA application_id").fetchone()[0], db.execute("PRAGMA user_version").fetchone()[0])


def _mark(db: Database) -> None:
    """Set the file's marks (inside the caller's transaction, so they change with the steps they count)."""
    (steps,) = db.execute("SELECT count(*) FROM _migrations").fetchone()
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {steps}")


def applied_migrations(db: Database | sqlite3.Connection) -> set[str]:
    """The steps recorded in `_migrations`; none in a new file (which has no such table)."""
    if not db.execute("SELECT 1 FROM sqlite_schema WHERE name = '_migrations'").fetchone():
        return set()
    return {name for (name,) in db.execute("SELECT name FROM _migrations")}


def apply_migrations(db: Database, migrations: Sequence[Migration] = MIGRATIONS) -> None:
    """Apply the steps of `migrations` the database lacks, each all or nothing: one transaction with its
    `_migrations` row and the file's marks (a new file gets its `_migrations` table in the first one).
    A database of an older kvchat, without marks, gets them. Safe when several processes open a new
    database at once. Tests pass a prefix of MIGRATIONS to build the database an older kvchat made.
    Whether the file is kvchat's at all is for the caller to ask first (storage/db/identity.py)."""
    applied = applied_migrations(db)
    known = {name for name, _ in MIGRATIONS}
    if unknown := sorted(applied - known):
        raise StorageError(
            f"The conversation database was made by a newer kvchat (it has migration {unknown[0]}); "
            "upgrade kvchat to open it."
        )
    for name, step in migrations:
        if name in applied:
            continue
        with transaction(db, f"the database upgrade {name}"):
            db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
            # Another process may have applied it since we looked; we hold the write lock now.
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", [name]).fetchone():
                continue
            step(db)
            db.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", [name, time.time()])
            _mark(db)
    if applied and marks(db) != (APPLICATION_ID, len(applied_migrations(db))):
        with transaction(db, "the database's marks"):
            _mark(db)
