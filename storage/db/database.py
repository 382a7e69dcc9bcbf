"""ConversationDatabase: the one door to an open conversation database (kvchat.db).

It owns the connection, the lock that keeps one thread's transaction from interleaving with
another's statements, and the read-only sentence. The conversations (conversations.py), the
streaming replies (streaming_replies.py), the trash (trash.py) and the K/V block store's index
(storage/kv/index.py) are objects composed over it, as datasette's `Database` is the one door to
each of its files: they read with `rows()` and write their statements inside `write()` (one
transaction, under the lock). Backups, the health check and recovery open connections of their
own (connection.py).

On a full disk `write_retrying` first makes the write-ahead log start over from its
beginning (a checkpoint), so the space it already holds is used again, and tries once more.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from sqlite_utils import Database

from storage.db.transaction import transaction
from storage.errors import StorageError, sqlite_errors

T = TypeVar("T")


def is_disk_full(error: StorageError) -> bool:
    cause = error.__cause__
    return isinstance(cause, sqlite3.Error) and (cause.sqlite_errorcode & 0xFF) == sqlite3.SQLITE_FULL


class ConversationDatabase:
    """One open conversation database. Safe to share between threads, and between processes on one
    database."""

    def __init__(self, db: Database, read_only_reason: str | None = None):
        self.db = db
        # None: writes allowed. Otherwise the connection is read-only and this is the one sentence
        # (a damaged file, a read-only folder, opened for reading) that every write raises.
        self.read_only_reason = read_only_reason
        # One connection serves all threads; a transaction must not interleave with another
        # thread's statements.
        self.lock = threading.RLock()
        self.closed = False

    def close(self) -> None:
        # Under the lock: Python's sqlite3 does not guard a connection closed while another thread is
        # inside a statement on it, and that crashed the process (a chat quitting while its engine
        # thread still read a conversation's history). After this, every read or write says so.
        with self.lock:
            self.closed = True
            self.db.close()

    def _require_open(self) -> None:
        if self.closed:
            raise StorageError("The conversation database was closed: kvchat is shutting down.")

    @contextmanager
    def write(self, what: str) -> Iterator[None]:
        """One write transaction (storage/db/transaction.py) under the lock; `what` names the change
        for the error sentence. Refused with `read_only_reason` on a read-only database."""
        if self.read_only_reason is not None:
            raise StorageError(self.read_only_reason)
        with self.lock:
            self._require_open()
            with transaction(self.db, what):
                yield

    def rows(self, sql: str, params: Sequence | dict = ()) -> list[dict]:
        with self.lock, sqlite_errors("the conversations could not be read"):
            self._require_open()
            return list(self.db.query(sql, params))

    def write_retrying(self, what: str, body: Callable[[], T]) -> T:
        """`body` in one write transaction; on a full disk, once more after the write-ahead log starts over."""
        try:
            with self.write(what):
                return body()
        except StorageError as error:
            if not is_disk_full(error):
                raise
        self.restart_log()
        with self.write(what):
            return body()

    def restart_log(self) -> bool:
        """Copy the write-ahead log into the database and make the next write start at the log's
        beginning, so it reuses the space the log already holds instead of growing it. False if that
        could not be done now (another process is reading an older state, or the disk is full)."""
        with self.lock:
            if self.closed:
                return False
            try:
                busy, _, _ = self.db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            except sqlite3.Error:
                return False
        return busy == 0
