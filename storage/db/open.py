"""Opening the conversation database: for writing, or read-only when it must be, and the one sentence
for a file that cannot be opened. Transactions: storage/db/transaction.py; errors: storage/errors.py."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlite_utils import Database

from storage.db import backup, connection, health
from storage.db.connection import connect
from storage.db.files import companion, holder, refuse_special_file
from storage.db.identity import refusal
from storage.db.migrations import MIGRATIONS, applied_migrations, apply_migrations
from storage.errors import BUSY_TIMEOUT_S, CAUSES, SALVAGE, WAL_GONE, StorageError, error_code

WAL_CHECKPOINT_PAGES = 16


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
            if error_code(error) & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@dataclass(frozen=True)
class OpenedDatabase:
    """What open_database opened. `read_only_reason` is None when writes are allowed; otherwise the
    connection is read-only (SQLite itself refuses writes) and it is the one sentence that says why
    (a damaged file, a read-only folder, or that the caller asked only to read), for every write
    the store refuses."""

    db: Database
    read_only_reason: str | None

    @property
    def writable(self) -> bool:
        return self.read_only_reason is None


READING_ONLY = "The conversation database was opened for reading only."


def damaged_read_only(path: Path) -> str:
    return f"{path} is damaged; kvchat opened it read-only; `kvchat db recover` salvages it."


def open_database(path: Path, *, write: bool = True) -> OpenedDatabase:
    """The database at `path`, at the current schema.

    write=True (the chat, `kvchat ask`, delete, rename): created with its folder if missing, its
    file checked (PRAGMA quick_check, storage/db/health.py), migrated, and backed up once a day
    (storage/db/backup.py). A damaged file, or one in a read-only folder, is opened read-only
    instead, with the reason. write=False (list, show, search, export): opened read-only, nothing
    checked, migrated or created, so a lock held by another kvchat, a full disk or a read-only
    folder does not stop reading. Raises StorageError, one sentence by cause, where it cannot be
    read at all.
    """
    refuse_special_file(path)
    if not write:
        return OpenedDatabase(_open_for_reading(path), READING_ONLY)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StorageError(f"Cannot create the folder {path.parent}: {error.strerror}.") from error
    existed = path.exists()
    reason = _write_refusal(path)
    if reason is None:
        try:
            opened = _open_for_writing(path, existed)
            if opened is not None:
                return opened
            reason = damaged_read_only(path)
        except (sqlite3.Error, StorageError) as error:
            cause = error if isinstance(error, sqlite3.Error) else error.__cause__
            if not isinstance(cause, sqlite3.Error):
                raise  # a database made by a newer kvchat
            reason = _read_only_cause(path, cause)
            if reason is None:
                failure = cannot_open(path, cause)
                if failure is cause:
                    raise
                raise failure from cause
    elif not existed:
        raise StorageError(f"{path.parent} cannot be written: kvchat cannot create its conversation database "
                           "there; set KVCHAT_HOME to a folder it can write.")
    return OpenedDatabase(_open_for_reading(path), reason)


def _folder_read_only(path: Path) -> str:
    return f"The folder {path.parent} is read-only; kvchat opened {path.name} read-only (nothing new is saved)."


def _file_read_only(path: Path) -> str:
    return f"{path} is read-only; kvchat opened it read-only (nothing new is saved)."


def _write_refusal(path: Path) -> str | None:
    """Why `path` cannot be written (a read-only folder or file), or None."""
    if not connection.folder_writable(path.parent):
        return _folder_read_only(path)
    if path.exists() and not os.access(path, os.W_OK):
        return _file_read_only(path)
    return None


def _open_for_writing(path: Path, existed: bool) -> OpenedDatabase | None:
    """None if quick_check finds the file damaged. Raises sqlite3.Error, or StorageError from a
    migration, where SQLite failed."""
    # Checked before anything writes: a damaged file is never opened for writing.
    if existed and health.is_damaged(path):
        return None
    if existed:
        _refuse_if_not_ours(path)
    conn = connect(path)
    try:
        _enable_wal(conn)
        # NORMAL in WAL syncs at checkpoints, not at every commit: a committed transaction
        # survives the process being killed (it is in the WAL file, in the OS cache), but a
        # power loss or OS crash may lose the last few commits (never corrupting the file).
        conn.execute("PRAGMA synchronous=NORMAL")
        # The log starts over once 16 pages (64 KB) are copied back, instead of at SQLite's 4 MB, so a
        # streaming reply's saves reuse the same small stretch of disk: on a nearly full disk a 4 MB log
        # is what runs out of room first. A checkpoint this small costs a few ms, every few seconds at most.
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        conn.execute("PRAGMA foreign_keys=ON")
        # No sqlite-utils plugins: whatever the user installed must not change our connection.
        db = Database(conn, execute_plugins=False)
        apply_migrations(db)
    except BaseException:
        conn.close()
        raise
    if existed:
        backup.daily_backup_quietly(conn, path)
    return OpenedDatabase(db, None)


def _refuse_if_not_ours(path: Path) -> None:
    """StorageError if `path` is not a database kvchat may write (storage/db/identity.py), asked over a
    read-only connection: not even a checkpoint of another program's log is written to it."""
    conn = connect(path, read_only=True)
    try:
        refused = refusal(conn, path)
    finally:
        conn.close()
    if refused is not None:
        raise StorageError(refused)


def _read_only_cause(path: Path, error: sqlite3.Error) -> str | None:
    """The reason to open `path` read-only after opening it for writing failed with `error`, or None
    (what os.access did not foresee: ACLs, a network filesystem, damage quick_check missed)."""
    code = error_code(error)
    if code == sqlite3.SQLITE_READONLY_DIRECTORY:
        return _folder_read_only(path)
    if code & 0xFF == sqlite3.SQLITE_READONLY:
        return _file_read_only(path)
    if code & 0xFF == sqlite3.SQLITE_CORRUPT:
        return damaged_read_only(path)
    return None


def cannot_open(path: Path, error: sqlite3.Error) -> StorageError | sqlite3.Error:
    """The one sentence for `path` that could not be opened, by what SQLite reported (reproduced
    for each); `error` itself when it is not about the file or the disk (a bug)."""
    code = error_code(error)
    primary = code & 0xFF
    if code == sqlite3.SQLITE_IOERR_SHORT_READ and companion(path, "-shm").exists():
        sentence = (f"{companion(path, '-wal')} was removed while another kvchat had the database open: {WAL_GONE[1]}"
                    " (the conversations are intact)")
    elif primary == sqlite3.SQLITE_FULL or code == sqlite3.SQLITE_IOERR_SHMSIZE or (
            primary == sqlite3.SQLITE_IOERR and _disk_full(path.parent)):
        sentence = (f"The disk is full: kvchat could not open {path} for writing; free some space and start "
                    "again (nothing in it was changed)")
    elif primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
        sentence = (f"{path} is damaged or not a SQLite database: {SALVAGE}, `kvchat db restore` puts the "
                    "newest backup in its place")
    elif primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        sentence = (f"{holder(path)} kept {path} locked for over {BUSY_TIMEOUT_S:.0f} s, so kvchat could not open it; "
                    "try again when it is done")
    elif primary == sqlite3.SQLITE_CANTOPEN:
        why = _why_cannot_open(path)
        sentence = (f"{path} cannot be opened ({why})" if why else f"{path} cannot be opened: check the "
                    "permissions of the file, of its -wal and -shm, and of its folder")
    elif primary == sqlite3.SQLITE_READONLY:
        sentence = (f"{path} cannot be opened: SQLite has to write to open it (to recover its write-ahead log, say), "
                    "but the file, its -wal or -shm, or its folder is read-only")
    elif primary == sqlite3.SQLITE_PERM:
        sentence = (f"{path} cannot be opened: the system denied access to it; check the permissions of the file "
                    "and of its folder, and any security policy (SELinux, AppArmor)")
    elif primary == sqlite3.SQLITE_IOERR:
        sentence = f"{CAUSES[primary]}: {path} could not be opened; check the disk"
    else:
        return error
    return StorageError(sentence + ".")


def _why_cannot_open(path: Path) -> str | None:
    """What the system says opening the file or the files beside it ("kvchat.db-wal: Is a directory"),
    where SQLite says only "unable to open database file"; None if they open."""
    for file in (path, companion(path, "-wal"), companion(path, "-shm")):
        if not file.exists():
            continue
        try:
            os.close(os.open(file, os.O_RDWR | os.O_NONBLOCK))
        except OSError as error:
            return f"{file.name}: {error.strerror}"
    return None


def _disk_full(folder: Path) -> bool:
    """Whether an I/O error is likely the disk being full: SQLite reports a full disk as SQLITE_FULL
    when a page does not fit, but as an I/O error when its -shm index cannot be made."""
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


def _open_for_reading(path: Path) -> Database:
    """`path` read-only; one at an older schema is read through a migrated copy in memory, and
    none at all reads as an empty database (nothing is created). Raises StorageError by cause."""
    if not path.exists():
        db = Database(_memory(), execute_plugins=False)
    else:
        with _opening(path):
            source = connect(path, read_only=True)
        try:
            with _opening(path):
                refused = refusal(source, path)
                if refused is not None:
                    raise StorageError(refused)
                current = applied_migrations(source) == {name for name, _ in MIGRATIONS}
                if current:
                    return Database(source, execute_plugins=False)
                copy = _memory()
                source.backup(copy)
        except BaseException:
            source.close()
            raise
        source.close()
        db = Database(copy, execute_plugins=False)
    apply_migrations(db)  # also refuses a database made by a newer kvchat
    return db


@contextmanager
def _opening(path: Path) -> Iterator[None]:
    """sqlite3 errors while opening `path` as the sentence cannot_open gives."""
    try:
        yield
    except sqlite3.Error as error:
        failure = cannot_open(path, error)
        if failure is error:
            raise
        raise failure from error


def _memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
