"""The package's errors: StorageError (said to the user), and SQLite's failures said as one sentence by
cause. (An older kvchat's snapshot file that cannot be used: storage/kv/legacy/snapshot_dir.SnapshotRejected.)

Imports nothing from storage, so every storage module can raise them."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

# Two kvchat processes may write to one database; a writer waits this long for the other
# one's transaction (they last milliseconds) before giving up. Here because LOCKED quotes it.
BUSY_TIMEOUT_S = 10.0

LOCKED = f"Another kvchat kept the conversation database locked for over {BUSY_TIMEOUT_S:.0f} s"
# What went wrong, by SQLite's primary result code, in words the user can act on.
CAUSES = {
    sqlite3.SQLITE_FULL: "The disk is full",
    sqlite3.SQLITE_IOERR: "The disk could not be read or written (disk I/O error)",
    sqlite3.SQLITE_BUSY: LOCKED,
    sqlite3.SQLITE_LOCKED: LOCKED,
    sqlite3.SQLITE_READONLY: "The conversation database is read-only",
    sqlite3.SQLITE_CANTOPEN: "The conversation database cannot be created or opened (check the folder's permissions)",
    sqlite3.SQLITE_CORRUPT: "The conversation database is damaged",
    sqlite3.SQLITE_NOTADB: "The conversation database is damaged or not a SQLite database",
}
SALVAGE = "`kvchat db recover` salvages what it still holds"
# What to do about it, where that is not plain from the cause.
ADVICE = {sqlite3.SQLITE_CORRUPT: SALVAGE, sqlite3.SQLITE_NOTADB: SALVAGE}
# Reading a page the -shm index places in the -wal, past the log's end: the log was removed (or
# cut short) while another connection had the database open. The database itself is sound.
WAL_GONE = ("The write-ahead log (the database's -wal file) was removed while another kvchat had it open",
            "quit that kvchat (it still holds the latest changes and writes them back as it exits), then try again")


class StorageError(Exception):
    """Something the user can act on (disk full, damaged file, unknown id), in one sentence."""


@contextmanager
def sqlite_errors(consequence: str) -> Iterator[None]:
    """Turn an environment failure (disk full, I/O error, lock timeout, damaged file) into a
    StorageError "<cause>: <consequence>."; other sqlite3 errors are bugs and pass through."""
    try:
        yield
    except sqlite3.Error as error:
        code = error_code(error)
        primary = code & 0xFF  # extended codes carry detail above 8 bits
        cause, advice = WAL_GONE if code == sqlite3.SQLITE_IOERR_SHORT_READ else (CAUSES.get(primary),
                                                                                 ADVICE.get(primary))
        if cause is None:
            raise
        raise StorageError(f"{cause}: {consequence}" + (f"; {advice}." if advice else ".")) from error


def error_code(error: sqlite3.Error) -> int:
    """SQLite's extended result code of `error` (0 for an error raised by Python's sqlite3 itself)."""
    return getattr(error, "sqlite_errorcode", None) or 0
