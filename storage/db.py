"""Opening the conversation database, transactions, and SQLite errors said as one sentence."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

# Two kvchat processes may write to one database; a writer waits this long for the other
# one's transaction (they last milliseconds) before giving up.
BUSY_TIMEOUT_S = 10.0

_LOCKED = f"Another kvchat kept the conversation database locked for over {BUSY_TIMEOUT_S:.0f} s"
# What went wrong, by SQLite's primary result code, in words the user can act on.
_CAUSES = {
    sqlite3.SQLITE_FULL: "The disk is full",
    sqlite3.SQLITE_IOERR: "The disk could not be read or written (disk I/O error)",
    sqlite3.SQLITE_BUSY: _LOCKED,
    sqlite3.SQLITE_LOCKED: _LOCKED,
    sqlite3.SQLITE_READONLY: "The conversation database is read-only",
    sqlite3.SQLITE_CANTOPEN: "The conversation database cannot be created or opened (check the folder's permissions)",
    sqlite3.SQLITE_CORRUPT: "The conversation database is damaged",
    sqlite3.SQLITE_NOTADB: "The conversation database is damaged or not a SQLite database",
}


class StorageError(Exception):
    """Something the user can act on (disk full, damaged file, unknown id), in one sentence."""


@contextmanager
def sqlite_errors(consequence: str) -> Iterator[None]:
    """Turn an environment failure (disk full, I/O error, lock timeout, damaged file) into a
    StorageError "<cause>: <consequence>."; other sqlite3 errors are bugs and pass through."""
    try:
        yield
    except sqlite3.Error as error:
        cause = _CAUSES.get(error.sqlite_errorcode & 0xFF)  # extended codes carry detail above 8 bits
        if cause is None:
            raise
        raise StorageError(f"{cause}: {consequence}.") from error


@contextmanager
def transaction(db: Database, what: str = "the change") -> Iterator[Database]:
    """One write transaction: committed when the block ends, rolled back if it raises.

    Write with `db.execute` inside it. `what` names the change for the error sentence
    ("The disk is full: the reply was not saved."). Not reentrant.
    """
    with sqlite_errors(f"{what} was not saved"):
        # IMMEDIATE takes the write lock now, waiting up to the busy timeout; a deferred
        # transaction that reads first and then writes would fail at once with SQLITE_BUSY
        # in WAL mode if another process committed in between.
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back by itself (e.g. after SQLITE_FULL).
            if db.conn.in_transaction:
                db.execute("ROLLBACK")
            raise


def _enable_wal(conn: sqlite3.Connection) -> None:
    """WAL: readers never block the writer, so one kvchat can list conversations while another
    streams a reply. Also the first read of the file: garbage bytes fail here (SQLITE_NOTADB)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            # Two processes switching a new file to WAL at once can deadlock on its lock; SQLite
            # then fails one at once instead of waiting, so that one waits and tries again.
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def open_database(path: Path) -> Database:
    """Open (creating it and its directory if needed) the database at `path`, migrated to the
    current schema. Raises StorageError for a file that is not a kvchat database."""
    from storage.migrations import apply_migrations  # migrations.py builds on this module

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StorageError(f"Cannot create the folder {path.parent}: {error.strerror}.") from error
    with sqlite_errors(f"{path} could not be opened (move it aside and kvchat starts a new one)"):
        # Autocommit (isolation_level=None): transaction() decides where transactions begin.
        # `timeout` is SQLite's busy timeout: a second kvchat waits instead of "database is locked".
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        try:
            _enable_wal(conn)
            # NORMAL in WAL syncs at checkpoints, not at every commit: a committed transaction
            # survives the process being killed (it is in the WAL file, in the OS cache), but a
            # power loss or OS crash may lose the last few commits (never corrupting the file).
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            # No sqlite-utils plugins: whatever the user installed must not change our connection.
            db = Database(conn, execute_plugins=False)
            apply_migrations(db)
        except BaseException:
            conn.close()
            raise
    return db
