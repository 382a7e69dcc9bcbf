"""Whether a SQLite file is kvchat's conversation database, asked before kvchat writes a byte to it.

KVCHAT_HOME may point at a folder where another program keeps a `kvchat.db`, or a file may have been
copied over it. Migrating such a file failed half-way with a traceback (`table "conversations" already
exists`) after writing to it. A file is kvchat's when it is empty (kvchat creates it), carries kvchat's
application_id (storage/db/migrations.py sets it with every step), or, from a kvchat older than that mark,
has a `_migrations` table of kvchat's shape that lists kvchat's steps. Even then the steps it lacks must
not meet tables of the same names: a table kvchat's record does not account for was made by someone
else, and kvchat leaves the file alone rather than guess whose it is.
"""

from __future__ import annotations

import sqlite3
from functools import cache
from pathlib import Path

from sqlite_utils import Database

from storage.db.migrations import APPLICATION_ID, MIGRATIONS, apply_migrations, applied_migrations

_MIGRATIONS_COLUMNS = ["name", "applied_at"]


def refusal(conn: sqlite3.Connection, path: Path) -> str | None:
    """The one sentence refusing `path` (open as `conn`, which this only reads) if it is not a
    conversation database kvchat may write, or None. sqlite3.Error where the file cannot be read."""
    reason = _not_ours(conn)
    if reason is not None:
        return (f"{path} is not a kvchat conversation database ({reason}); kvchat leaves it unchanged: "
                "move it away, or set KVCHAT_HOME to another folder.")
    clash = _clash(conn)
    if clash is not None:
        step, names = clash
        return (f"{path} already has {', '.join(names)}, which kvchat's upgrade {step} makes, though its record "
                "of upgrades (_migrations) does not list that step; kvchat leaves it unchanged: move it away, "
                "or set KVCHAT_HOME to another folder.")
    return None


def _names(conn: sqlite3.Connection) -> set[str]:
    """The names of every table, index, trigger and view, SQLite's own left out."""
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_schema") if not name.startswith("sqlite_")}


def _not_ours(conn: sqlite3.Connection) -> str | None:
    (application_id,) = conn.execute("PRAGMA application_id").fetchone()
    if application_id not in (0, APPLICATION_ID):
        return f"another application marked it as its own: application_id {application_id:#010x}"
    names = _names(conn)
    if not names:
        return None  # an empty file: kvchat makes its tables in it
    if "_migrations" not in names:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        return f"it holds tables kvchat did not make: {shown}"
    columns = [row[1] for row in conn.execute("PRAGMA table_info(_migrations)")]
    if columns != _MIGRATIONS_COLUMNS:
        return "its _migrations table is another program's"
    known = {name for name, _ in MIGRATIONS}
    applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
    if application_id == 0 and names != {"_migrations"} and not applied & known:
        return "its _migrations table lists none of kvchat's upgrades"
    return None


def _clash(conn: sqlite3.Connection) -> tuple[str, list[str]] | None:
    """The first step the file lacks whose tables, indexes or triggers it already has, with their names."""
    applied = applied_migrations(conn)
    pending = [name for name, _ in MIGRATIONS if name not in applied]
    if not pending:
        return None
    present = _names(conn)
    for step in pending:
        made = sorted(_made_by(step) & present)
        if made:  # an FTS table's shadow tables (messages_fts_data, ...) go without saying
            return step, [name for name in made if not any(name.startswith(f"{other}_") for other in made)]
    return None


@cache
def _made_by(step: str) -> frozenset[str]:
    """The names the migration `step` adds to a database that has every step before it (measured by
    applying them to an empty database in memory, so a new step needs no list kept by hand)."""
    at = [name for name, _ in MIGRATIONS].index(step)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db = Database(conn, execute_plugins=False)
        apply_migrations(db, MIGRATIONS[:at])
        earlier = _names(conn)
        apply_migrations(db, MIGRATIONS[: at + 1])
        return frozenset(_names(conn) - earlier - {"_migrations"})
    finally:
        conn.close()
