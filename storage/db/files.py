"""The conversation database as files: where it is, the files SQLite keeps beside it, whether
another process has it open, and moving it aside without losing any of it."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path

import storage.data_dir
from storage.db.turn_lock import turn_under_way
from storage.disk_files import fsync_dir
from storage.errors import StorageError

DATABASE_NAME = "kvchat.db"
# SQLite's write-ahead log and its index: committed changes may live only in the -wal until a
# checkpoint copies them into the file, so the three files move together.
COMPANIONS = ("-wal", "-shm")


def database_path(home: Path | None = None) -> Path:
    """The conversation database of the data dir `home` (default: the kvchat data dir)."""
    return (home or storage.data_dir.data_dir()) / DATABASE_NAME


def companion(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def refuse_special_file(path: Path) -> None:
    """StorageError if `path` exists but is not a regular file (a folder, a FIFO, a device): SQLite
    would fail on a folder with a misleading cause, and reading a FIFO waits forever for a writer."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there (yet)
        return
    except OSError as error:
        raise StorageError(f"{path} cannot be examined: {error.strerror}.") from error
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a regular file")
        raise StorageError(f"{path} is {kind}, not a database file: move it away, or set KVCHAT_HOME to "
                           "another folder.")


def in_use(path: Path) -> bool:
    """Whether another process has the database open. Every WAL connection that has read holds a
    shared lock on the file for as long as it is open, so an exclusive lock is refused at once."""
    if not path.exists():
        return False
    probe = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        probe.execute("PRAGMA locking_mode=EXCLUSIVE")
        probe.execute("BEGIN EXCLUSIVE")
        probe.execute("ROLLBACK")
    except sqlite3.Error as error:
        # A file too damaged to lock is not in use for all we can tell; its damage is reported elsewhere.
        return error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    finally:
        # Closing the last connection may fold the -wal into the file: the same content, in one file.
        probe.close()
    return False


def holder(path: Path) -> str:
    """Who has the database `path` open, for a sentence: "Another kvchat" where one is known to (it holds a
    turn lock: storage/db/turn_lock.py), else "Another program" (a kvchat idle in a chat, or sqlite3, a backup
    tool: SQLite's lock does not say)."""
    return "Another kvchat" if turn_under_way(path.parent) else "Another program"


def move_aside(path: Path, label: str, now: float | None = None) -> Path:
    """Rename the database and its -wal/-shm to `<name>.<label>-<time>` (and its -wal/-shm), so the
    set still opens as one database. Returns the new path of the database file; never overwrites."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while any(companion(target, suffix).exists() for suffix in ("", *COMPANIONS)):
        n += 1
        target = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
    # The -wal before the file: cut short in between, the database opens as an older state until the
    # log is moved back, where a log left behind could be replayed into the next new database.
    for suffix in (*COMPANIONS, ""):
        if companion(path, suffix).exists():
            os.replace(companion(path, suffix), companion(target, suffix))
    return target


def replace_database(path: Path, new: Path, label: str) -> Path | None:
    """Put the database file `new` at `path`, the one there (if any) moved aside first with
    move_aside(path, label). Returns where that one went."""
    aside = move_aside(path, label) if path.exists() else None
    os.replace(new, path)
    fsync_dir(path.parent)
    return aside
