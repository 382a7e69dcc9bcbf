"""Backups of the conversation database through SQLite's online backup API (a consistent copy
while other kvchats read and write): a rolling one when kvchat opens a sound database for
writing, at most once a day, the newest KEEP kept in `<data dir>/backups/`; `kvchat db backup`
now; and `kvchat db restore`, which puts one back with the current file moved aside.

A backup is written to a temp file and renamed into place, so a backup that exists is whole. It
is one self-contained file (rollback journal, no -wal). Measured on 1,000 conversations x 20
messages of ~1 KB (95 MB): 160-180 ms, once a day.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from storage.db.connection import connect
from storage.db.files import holder, in_use, refuse_special_file, replace_database
from storage.db.health import damaged, problems
from storage.db.migrations import MIGRATIONS
from storage.disk_files import fsync_dir
from storage.errors import StorageError, error_code, sqlite_errors

log = logging.getLogger("kvchat")

KEEP = 3
EVERY_S = 24 * 3600.0
STALE_TEMP_S = 3600.0  # a temp file this old belongs to a backup that died


def backup_folder(path: Path) -> Path:
    return path.parent / "backups"


def backups(path: Path) -> list[Path]:
    """The backups of the database at `path`, oldest first (by when they were written)."""
    try:
        found = [(entry.stat().st_mtime, Path(entry.path)) for entry in os.scandir(backup_folder(path))
                 if entry.is_file() and entry.name.startswith(f"{path.stem}-") and entry.name.endswith(".db")]
    except FileNotFoundError:
        return []
    return [backup for _, backup in sorted(found)]


def write_backup(source: sqlite3.Connection, target: Path) -> None:
    """Copy the database of `source` to `target`, replacing it: a temp file beside it, renamed."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        copy = sqlite3.connect(temp)
        try:
            source.backup(copy)
            copy.execute("PRAGMA journal_mode=DELETE")  # the copy takes the WAL flag of its source
        finally:
            copy.close()
        os.replace(temp, target)
        fsync_dir(target.parent)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _new_backup_path(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target, n = backup_folder(path) / f"{path.stem}-{stamp}.db", 1
    while target.exists():
        n += 1
        target = backup_folder(path) / f"{path.stem}-{stamp}-{n}.db"
    return target


def _prune(path: Path, now: float) -> None:
    for old in backups(path)[:-KEEP]:
        old.unlink(missing_ok=True)
    for temp in backup_folder(path).glob(".*.tmp"):
        if now - temp.stat().st_mtime > STALE_TEMP_S:
            temp.unlink(missing_ok=True)


def daily_backup(source: sqlite3.Connection, path: Path, now: float | None = None) -> Path | None:
    """A backup of `path` (open as `source`, already checked sound) unless the newest is under
    EVERY_S old; the oldest beyond KEEP go. Returns the new backup, or None."""
    now = time.time() if now is None else now
    existing = backups(path)
    if existing and now - existing[-1].stat().st_mtime < EVERY_S:
        return None
    backup_folder(path).mkdir(exist_ok=True)
    target = _new_backup_path(path, now)
    write_backup(source, target)
    _prune(path, now)
    return target


def daily_backup_quietly(source: sqlite3.Connection, path: Path) -> None:
    """daily_backup, where a failure (a full disk, a read-only backups folder) is one log line:
    the backup is a safety net, not a reason to refuse to open the conversations."""
    try:
        daily_backup(source, path)
    except (OSError, sqlite3.Error) as error:
        log.warning("kvchat: the daily backup of %s was not made: %s", path, error)


def backup_now(path: Path, target: Path | None = None) -> Path:
    """`kvchat db backup [FILE]`: a backup of the sound database at `path` to `target` (refused if it
    exists) or a new file in the backups folder. Returns where it went; StorageError otherwise."""
    if not path.exists():
        raise StorageError(f"There is no conversation database at {path} yet: nothing to back up.")
    if target is not None and (target.exists() or target.is_symlink()):
        raise StorageError(f"{target} already exists; `kvchat db backup` does not overwrite a file.")
    with sqlite_errors(f"{path} could not be backed up"):
        source = connect(path, read_only=True)
        try:
            if problems(source):
                raise StorageError(f"{damaged(path)[:-1]}; no backup was made (it would copy the damage).")
            now = time.time()
            if target is None:
                backup_folder(path).mkdir(exist_ok=True)
                target = _new_backup_path(path, now)
            try:
                write_backup(source, target)
                if target.parent == backup_folder(path):
                    _prune(path, now)
            except OSError as error:
                raise StorageError(f"Cannot write {target}: {error.strerror or error}.") from error
        finally:
            source.close()
    return target


def _verify_backup(source: Path) -> sqlite3.Connection:
    """A read-only connection to `source` if it is a sound kvchat database this kvchat can open."""
    refuse_special_file(source)
    if not source.is_file():
        raise StorageError(f"{source} does not exist.")
    conn = connect(source, read_only=True)
    try:
        if problems(conn):
            raise StorageError(f"{source} is damaged; kvchat restores only a sound backup.")
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        if not {"_migrations", "conversations"} <= tables:
            raise StorageError(f"{source} is not a kvchat conversation database.")
        applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
        if applied - {name for name, _ in MIGRATIONS}:
            raise StorageError(f"{source} was made by a newer kvchat; upgrade kvchat to restore it.")
    except sqlite3.DatabaseError as error:
        conn.close()
        if error_code(error) & 0xFF != sqlite3.SQLITE_NOTADB:
            raise
        raise StorageError(f"{source} is not a SQLite database.") from error
    except BaseException:
        conn.close()
        raise
    return conn


def _same_file(source: Path, path: Path) -> bool:
    try:
        return os.path.samefile(source, path)  # a symlink or a second name of it too
    except OSError:
        return False  # one of them is missing: _verify_backup and restore say what follows


def restore(path: Path, source: Path | None = None) -> tuple[Path, Path | None]:
    """`kvchat db restore [FILE]`: put a copy of `source` (default: the newest backup) in place of
    the database at `path`, which (with its -wal and -shm) is moved aside, never overwritten.
    Returns (the backup restored, where the replaced database went or None if there was none)."""
    if source is None:
        existing = backups(path)
        if not existing:
            raise StorageError(f"There is no backup in {backup_folder(path)}; give the FILE to restore.")
        source = existing[-1]
    if _same_file(source, path):
        raise StorageError(f"{source} is the conversation database itself, not a backup of it; give a backup to "
                           f"restore (without a FILE, the newest in {backup_folder(path)}).")
    conn = _verify_backup(source)
    temp = path.with_name(f".{path.name}.restoring-{os.getpid()}")
    try:
        if in_use(path):
            raise StorageError(f"{holder(path)} has {path} open; quit it, then restore (what it writes "
                               "would go to the file moved aside).")
        with sqlite_errors(f"{source} was not restored"):
            copy = sqlite3.connect(temp)
            try:
                conn.backup(copy)
                copy.execute("PRAGMA journal_mode=WAL")  # as kvchat keeps its database
            finally:
                copy.close()
        replaced = replace_database(path, temp, "replaced")
    except OSError as error:
        raise StorageError(f"{source} was not restored: {error.strerror or error}.") from error
    finally:
        conn.close()
        temp.unlink(missing_ok=True)
    return source, replaced
