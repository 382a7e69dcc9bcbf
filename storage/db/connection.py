"""Connections to the conversation database: writable, or read-only without writing a byte.

Its own module so that everything that opens the file (open.py, the health check, backups, recovery)
shares one way of connecting, and open.py can use the health check and backups without a cycle.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from storage.db.files import companion
from storage.errors import BUSY_TIMEOUT_S, error_code

# Failures to make the -shm index SQLite keeps beside a WAL database: a full disk (SHMSIZE), a
# folder that cannot be written.
_NO_INDEX = {sqlite3.SQLITE_IOERR_SHMSIZE, sqlite3.SQLITE_IOERR_SHMOPEN, sqlite3.SQLITE_READONLY_DIRECTORY,
             sqlite3.SQLITE_CANTOPEN}


def connect(path: Path, *, read_only: bool = False) -> sqlite3.Connection:
    """A connection to `path` in autocommit mode (transaction() decides where transactions begin),
    shareable between threads (the store serialises its statements), waiting up to BUSY_TIMEOUT_S
    for another kvchat's lock instead of failing with "database is locked".

    read_only: SQLite's mode=ro, so not even a checkpoint writes to the file. Where SQLite cannot
    make the -shm index (a read-only folder, a full disk) and the -wal holds nothing, also
    immutable=1: no locks, no -shm. That is right only where no kvchat is writing, which is so:
    a writer keeps a -shm, and its commits in the -wal."""
    if not read_only:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
    uri = path.resolve().as_uri() + "?mode=ro"
    wal_empty = _is_empty(companion(path, "-wal"))
    if not folder_writable(path.parent) and not companion(path, "-shm").exists() and wal_empty:
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
    if wal_empty and "immutable" not in uri:
        try:
            conn.execute("SELECT 1 FROM sqlite_schema LIMIT 1")  # the first read makes the -shm
        except sqlite3.Error as error:
            if error_code(error) in _NO_INDEX:  # other failures are the caller's to meet and say
                conn.close()
                conn = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
    return conn


def _is_empty(file: Path) -> bool:
    try:
        return os.stat(file).st_size == 0
    except FileNotFoundError:
        return True


def folder_writable(folder: Path) -> bool:
    # Asked, not tried: a trial write would leave files in a folder that is only being read.
    return os.access(folder, os.W_OK)
