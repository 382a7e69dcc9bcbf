"""Whether the database file is sound: PRAGMA quick_check when kvchat opens it for writing, and
the full check of `kvchat db check` (integrity_check and the search index's own check).

quick_check reads every page: measured on 1,000 conversations x 20 messages of ~1 KB (95 MB) it
takes 60 ms with the file in the OS cache and 560 ms from disk, where opening takes 0-2 ms.
So a passed check is remembered in `kvchat.db.checked` beside the database, as the inode, size
and mtime of the file and of its -wal, and skipped while both are unchanged. The trade-off:
damage that leaves all three alone (a failing disk, a tool that keeps mtimes) goes unseen until
the next change to the file makes kvchat check again; any write by any kvchat is such a change.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from storage.db import connection
from storage.db.connection import connect
from storage.db.files import companion
from storage.db.identity import refusal
from storage.errors import error_code

log = logging.getLogger("kvchat")

STAMP_SUFFIX = ".checked"
_DAMAGE = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def damaged(path: Path) -> str:
    """The sentence for a damaged database, whatever opened it."""
    return f"{path} is damaged; `kvchat db recover` salvages what it still holds."


def file_version(path: Path) -> list:
    """What changes whenever the database's content may have: the inode, size and mtime of the file
    and of its -wal ("empty" for an empty one: a reader's open makes one; None for none)."""
    version: list = []
    for file in (path, companion(path, "-wal")):
        try:
            st = os.stat(file)
        except FileNotFoundError:
            version.append(None)
            continue
        version.append("empty" if file != path and st.st_size == 0 else [st.st_ino, st.st_size, st.st_mtime_ns])
    return version


def _wal_removed(path: Path, version: list) -> bool:
    # Every open connection keeps a -wal; a -shm without one means the log was removed under a
    # reader, which the check (a read past the log's end) then reports.
    return version[1] is None and companion(path, "-shm").exists()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + STAMP_SUFFIX)


def _passed_before(path: Path, version: list) -> bool:
    try:
        return json.loads(_stamp_path(path).read_text())["version"] == version
    except (OSError, ValueError, KeyError, TypeError):
        return False


def remember_passed(path: Path, version: list) -> None:
    """Record that the file at `version` passed; best effort (a full disk only costs a check)."""
    stamp = _stamp_path(path)
    temp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps({"version": version}))
        os.replace(temp, stamp)
    except OSError as error:
        log.debug("the check of %s was not remembered: %s", path, error)
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only file system refuses even this (EROFS, not "no such file"): nothing was written


def problems(conn: sqlite3.Connection, pragma: str = "quick_check") -> list[str]:
    """What PRAGMA quick_check (or integrity_check) reports, [] when the file is sound. A page so
    damaged that the check itself stops is one problem; other SQLite errors are raised."""
    try:
        rows = [row for (row,) in conn.execute(f"PRAGMA {pragma}")]
    except sqlite3.DatabaseError as error:
        if error_code(error) & 0xFF not in _DAMAGE:
            raise
        return [str(error)]
    # integrity_check heads its list with the schema's name ("*** in database main ***").
    return [] if rows == ["ok"] else [line for row in rows for line in row.splitlines() if not line.startswith("***")]


def is_damaged(path: Path) -> bool:
    """quick_check of `path` over a read-only connection, unless the file is as it was when it
    last passed. Raises sqlite3.Error for what is not damage (a lock, a missing -wal)."""
    version = file_version(path)  # before the check: a change meanwhile makes the next open check again
    if _passed_before(path, version) and not _wal_removed(path, version):
        return False
    conn = connect(path, read_only=True)
    try:
        found = problems(conn)
    finally:
        conn.close()
    if found:
        log.warning("kvchat: quick_check of %s: %s", path, "; ".join(found[:3]))
        return True
    remember_passed(path, version)
    return False


@dataclass
class CheckReport:
    """`kvchat db check`: a few lines to print, and whether the database is sound. `foreign` is the
    sentence refusing a sound SQLite file that is not kvchat's to use (storage/db/identity.py)."""

    lines: list[str] = field(default_factory=list)
    healthy: bool = True
    foreign: str | None = None


def check_database(path: Path) -> CheckReport:
    """The full integrity_check, then (if that passed) the search index's integrity-check and the
    counts. Never writes to the file."""
    report = CheckReport([f"{path}: {os.path.getsize(path) / 1e6:,.1f} MB"])
    version = file_version(path)
    conn = connect(path, read_only=True)
    try:
        found = problems(conn, "integrity_check")
        report.lines.append("integrity_check: ok" if not found else
                            f"integrity_check: {len(found)} problem(s), first: {found[0]}")
        if found:
            report.healthy = False
            report.lines.append("search index: not checked (the file is damaged)")
            return report
        report.foreign = refusal(conn, path)
        if report.foreign is not None:
            report.healthy = False
            report.lines.append("kvchat database: no (kvchat neither checks nor changes it further)")
            return report
        report.lines.append(_search_index_check(path, conn, report))
        for table in ("conversations", "messages"):
            if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = ?", [table]).fetchone():
                (count,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                report.lines.append(f"{table}: {count:,}")
    finally:
        conn.close()
    if report.healthy:
        remember_passed(path, version)
    return report


def _search_index_check(path: Path, conn: sqlite3.Connection, report: CheckReport) -> str:
    if not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'messages_fts'").fetchone():
        return "search index: none (an old database; kvchat adds it when it next opens it for writing)"
    # FTS5 runs its check as an INSERT, which a read-only connection refuses; it changes nothing.
    if not connection.folder_writable(path.parent):
        return "search index: not checked (its check needs a writable folder; this one is read-only)"
    try:
        writer = connect(path)
    except sqlite3.Error as error:
        return f"search index: not checked ({error})"
    try:
        writer.execute("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")
        return "search index: ok"
    except sqlite3.DatabaseError as error:
        if error_code(error) & 0xFF not in _DAMAGE:
            return f"search index: not checked ({error})"
        report.healthy = False
        return f"search index: damaged ({error})"
    finally:
        writer.close()
