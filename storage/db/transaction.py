"""One write transaction on the conversation database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlite_utils import Database

from storage.errors import sqlite_errors


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
