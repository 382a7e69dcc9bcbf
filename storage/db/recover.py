"""`kvchat db recover`: salvage what a damaged database still holds into a new one at the current
schema, then put the new one in its place (the damaged file moved aside, never deleted).

The damaged file is only read, through a read-only connection. Each table is read in rowid order;
where a page cannot be read (SQLITE_CORRUPT) the reader steps over it: it finds the next rowid
from which the table's b-tree can be searched again (doubling steps, then halving), as SQLite's
`.recover` skips pages it cannot parse. What the indexes list but no page yields is counted as
lost. Messages whose conversation is lost go under one "(recovered)" conversation; a message
whose parent is lost becomes the first message of its branch; the search index is rebuilt by the
schema's own triggers as the messages go in.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlite_utils import Database

from storage.db.connection import connect
from storage.db.files import holder, in_use, replace_database
from storage.db.migrations import apply_migrations
from storage.db.records import ROLES, STATUSES
from storage.errors import StorageError, error_code, sqlite_errors

RECOVERED_TITLE = "(recovered)"
_MAX_ROWID = 2**63 - 1
_DAMAGE = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_IOERR)
# Tables of the schema that are not user rows: the record of migrations, and the search index's
# own tables (rebuilt, never copied).
_NOT_COPIED = ("_migrations", "messages_fts", "sqlite_")


@dataclass(frozen=True)
class Recovered:
    conversations: int  # kept
    messages: int  # kept
    lost: int  # rows an index lists but no readable page holds, and rows too garbled to keep
    adopted: int  # messages put under the "(recovered)" conversation
    damaged_copy: Path  # where the damaged file went


def _is_damage(error: sqlite3.Error) -> bool:
    return error_code(error) & 0xFF in _DAMAGE


def _seek(conn: sqlite3.Connection, table: str, rowid: int) -> tuple[bool, int | None]:
    """(whether the b-tree can be searched from `rowid`, the first rowid there or None)."""
    try:
        row = conn.execute(f"SELECT rowid FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1", [rowid]).fetchone()
    except sqlite3.DatabaseError as error:
        if not _is_damage(error):
            raise
        return False, None
    return True, None if row is None else row[0]


def _resume_after(conn: sqlite3.Connection, table: str, start: int) -> int | None:
    """Where to go on reading `table` after a failure at the first row from `start`; None: nowhere."""
    readable, found = _seek(conn, table, start)
    if readable:  # the path is sound, the row itself is not (a garbled cell or overflow page)
        return None if found is None or found == _MAX_ROWID else found + 1
    failing, step = start, 1
    while True:
        probe = start + step
        if probe > _MAX_ROWID:
            return None
        if _seek(conn, table, probe)[0]:
            break
        failing, step = probe, step * 2
    while probe - failing > 1:  # the first readable rowid in (failing, probe]
        middle = (failing + probe) // 2
        if _seek(conn, table, middle)[0]:
            probe = middle
        else:
            failing = middle
    return probe


def readable_rows(conn: sqlite3.Connection, table: str, columns: list[str]) -> Iterator[tuple]:
    """(rowid, *columns) of every row of `table` that can be read, in rowid order. One row a query:
    a cursor reads a row ahead, so a scan failing at a bad page would lose the good row before it."""
    select = f"SELECT rowid, {', '.join(columns)} FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1"
    # SQLite numbers rows from 1 up (kvchat never sets a rowid), and stepping over a bad page
    # searches forward from where it failed: a start far below 0 would step over everything.
    start: int | None = 0
    while start is not None:
        try:
            row = conn.execute(select, [start]).fetchone()
        except sqlite3.DatabaseError as error:
            if not _is_damage(error):
                raise
            start = _resume_after(conn, table, start)
            continue
        if row is None:
            return
        yield row
        start = None if row[0] == _MAX_ROWID else row[0] + 1


def _until_damage(query: Callable[[], Iterable[tuple]]) -> Iterator[tuple]:
    """The rows of `query` up to the first page SQLite cannot read (and so without the row before
    it, which the cursor had read ahead)."""
    try:
        yield from query()
    except sqlite3.DatabaseError as error:
        if not _is_damage(error):
            raise


def _readable_rows_without_rowid(conn: sqlite3.Connection, table: str, columns: list[str]) -> list[tuple]:
    """A WITHOUT ROWID table cannot be searched by rowid: read it in order up to the first bad page."""
    return list(_until_damage(lambda: conn.execute(f"SELECT NULL, {', '.join(columns)} FROM {table}")))


def _indexed_rowids(conn: sqlite3.Connection, table: str) -> set[int]:
    """The rowids the table's (full) indexes list, as far as they can be read: the rows that exist."""
    rowids: set[int] = set()
    for index in conn.execute(f"PRAGMA index_list({table})").fetchall():
        name, partial = index[1], index[4]
        if not partial:  # a partial index lists only some rows, and INDEXED BY it would be refused
            rowids.update(rowid for (rowid,) in _until_damage(
                lambda: conn.execute(f"SELECT rowid FROM {table} INDEXED BY [{name}]")))
    return rowids


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    sql = conn.execute("SELECT sql FROM sqlite_schema WHERE name = ?", [table]).fetchone()[0]
    return "WITHOUT ROWID" not in sql.upper()


class _Salvage:
    """Reads the damaged database `source`, writes the new one `target` (at the current schema)."""

    def __init__(self, source: sqlite3.Connection, target: sqlite3.Connection):
        self.source, self.target = source, target
        self.lost = self.adopted = 0
        self.conversations: set[str] = set()
        self.messages: dict[str, str] = {}  # id -> conversation id
        self.recovered_id: str | None = None

    def rows(self, table: str) -> Iterator[dict]:
        """The readable rows of `table` in the source, as dicts of the columns both schemas have."""
        source_tables = {name for (name,) in self.source.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        if table not in source_tables:
            return
        wanted = set(_columns(self.target, table))
        columns = [c for c in _columns(self.source, table) if c in wanted]
        if not _has_rowid(self.source, table):
            yield from (dict(zip(columns, row[1:])) for row in _readable_rows_without_rowid(self.source, table, columns))
            return
        read: set[int] = set()
        for row in readable_rows(self.source, table, columns):
            read.add(row[0])
            yield dict(zip(columns, row[1:]))
        self.lost += len(_indexed_rowids(self.source, table) - read)

    def insert(self, table: str, row: dict) -> bool:
        names = ", ".join(row)
        try:
            self.target.execute(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(row))})",
                                list(row.values()))
        except (sqlite3.IntegrityError, sqlite3.InterfaceError, OverflowError):
            self.lost += 1  # garbled beyond use: NULL where a value must be, a duplicate id
            return False
        return True

    def copy_conversations(self) -> None:
        for row in self.rows("conversations"):
            if not _sound_conversation(row):
                self.lost += 1
            elif self.insert("conversations", row):
                self.conversations.add(row["id"])

    def copy_messages(self) -> None:
        rows = [row for row in self.rows("messages") if _sound_message(row) or self._lose()]
        for row in rows:
            if row["conversation_id"] not in self.conversations:
                row["conversation_id"] = self._recovered_conversation(row)
                self.adopted += 1
            self.messages[row["id"]] = row["conversation_id"]
        for row in rows:
            if row.get("parent_id") is not None and self.messages.get(row["parent_id"]) != row["conversation_id"]:
                row["parent_id"] = None  # its parent is lost: the first message of its branch
            if not self.insert("messages", row):
                del self.messages[row["id"]]

    def copy_other(self, table: str) -> None:
        for row in self.rows(table):
            self.insert(table, row)
        # Rows whose parent row was lost go too (e.g. the parts of a lost streaming reply).
        for fk in self.target.execute(f"PRAGMA foreign_key_list({table})").fetchall():
            parent, column, key = fk[2], fk[3], fk[4] or "rowid"
            self.lost += self.target.execute(
                f"DELETE FROM {table} WHERE {column} IS NOT NULL AND {column} NOT IN (SELECT {key} FROM {parent})"
            ).rowcount

    def _lose(self) -> bool:
        self.lost += 1
        return False

    def _recovered_conversation(self, message: dict) -> str:
        if self.recovered_id is None:
            self.recovered_id = secrets.token_hex(6)
            newest = self.target.execute("SELECT model FROM conversations ORDER BY updated_at DESC LIMIT 1").fetchone()
            created = message.get("created_at") or 0.0
            self.target.execute(
                "INSERT INTO conversations (id, title, model, params, created_at, updated_at) VALUES (?, ?, ?, '{}', ?, ?)",
                [self.recovered_id, RECOVERED_TITLE, newest[0] if newest else "unknown", created, created])
            self.conversations.add(self.recovered_id)
        return self.recovered_id

    def fix_conversations(self) -> None:
        """Each conversation's active leaf one of its messages (its newest, where it was lost), and
        the "(recovered)" one spanning its messages' times."""
        self.target.execute(
            "UPDATE conversations SET active_leaf = (SELECT id FROM messages WHERE conversation_id = conversations.id"
            " ORDER BY created_at DESC, seq DESC LIMIT 1) WHERE active_leaf IS NULL OR active_leaf NOT IN"
            " (SELECT id FROM messages WHERE conversation_id = conversations.id)")
        self.target.execute(
            "UPDATE conversations SET created_at = (SELECT min(created_at) FROM messages WHERE conversation_id = ?),"
            " updated_at = (SELECT max(updated_at) FROM messages WHERE conversation_id = ?) WHERE id = ?",
            [self.recovered_id, self.recovered_id, self.recovered_id])


def _sound_conversation(row: dict) -> bool:
    try:
        return isinstance(row.get("id"), str) and isinstance(json.loads(row.get("params") or "{}"), dict)
    except (ValueError, TypeError):
        return False


def _sound_message(row: dict) -> bool:
    return (isinstance(row.get("id"), str) and isinstance(row.get("conversation_id"), str)
            and isinstance(row.get("text"), str) and isinstance(row.get("token_ids"), bytes)
            and len(row["token_ids"]) % 4 == 0 and row.get("role") in ROLES and row.get("status") in STATUSES)


def salvage(source: sqlite3.Connection, target_path: Path) -> _Salvage:
    """Write what `source` still holds into a new database at `target_path`."""
    target = sqlite3.connect(target_path, isolation_level=None)
    try:
        apply_migrations(Database(target, execute_plugins=False))
        target.execute("PRAGMA foreign_keys=OFF")  # rows go in as they come; the links are fixed here
        work = _Salvage(source, target)
        tables = [name for (name,) in target.execute("SELECT name FROM sqlite_schema WHERE type = 'table'"
                                                     " ORDER BY name") if not name.startswith(_NOT_COPIED)]
        target.execute("BEGIN")
        work.copy_conversations()
        work.copy_messages()
        for table in tables:
            if table not in ("conversations", "messages"):
                work.copy_other(table)
        work.fix_conversations()
        target.execute("COMMIT")
        target.execute("INSERT INTO messages_fts(messages_fts) VALUES('integrity-check')")
        target.execute("PRAGMA journal_mode=WAL")  # as kvchat keeps its database
    finally:
        target.close()
    return work


def recover(path: Path) -> Recovered:
    """Salvage the database at `path` into a new one, move the damaged file (and its -wal, -shm)
    aside as `<name>.damaged-<time>`, and put the new one in its place. StorageError, with nothing
    moved, if another process has it open or not even its list of tables can be read."""
    if not path.exists():
        raise StorageError(f"There is no conversation database at {path}: nothing to recover.")
    if in_use(path):
        raise StorageError(f"{holder(path)} has {path} open; quit it, then recover.")
    temp = path.with_name(f".{path.name}.recovering-{os.getpid()}")
    source = connect(path, read_only=True)
    try:
        try:
            source.execute("SELECT name FROM sqlite_schema").fetchall()
        except sqlite3.DatabaseError as error:
            raise StorageError(f"{path} is too damaged to recover (not even its list of tables can be read); "
                               "`kvchat db restore` puts the newest backup in its place.") from error
        with sqlite_errors("the recovered database was not written"):
            work = salvage(source, temp)
        damaged_copy = replace_database(path, temp, "damaged")
    except OSError as error:
        raise StorageError(f"{path} was not recovered: {error.strerror or error}.") from error
    finally:
        source.close()
        for suffix in ("", "-journal", "-wal", "-shm"):  # what a salvage cut short leaves
            temp.with_name(temp.name + suffix).unlink(missing_ok=True)
    kept = len(work.conversations) - (work.recovered_id is not None)
    return Recovered(kept, len(work.messages), work.lost, work.adopted, damaged_copy)
