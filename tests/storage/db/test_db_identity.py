"""A SQLite file that is not kvchat's (another program's tables, its mark, its own `_migrations`) or one a
step's tables already sit in is refused in one sentence and never written; kvchat marks its own files;
each upgrade step is all or nothing."""

import sqlite3

import pytest
from sqlite_utils import Database

from app.cli.main import main
from storage.db.conversations import ConversationStore
from storage.db.migrations import APPLICATION_ID, MIGRATIONS, apply_migrations, marks
from storage.errors import StorageError

REFUSED_TAIL = "kvchat leaves it unchanged: move it away, or set KVCHAT_HOME to another folder."


def another_programs_database(path, *statements: str) -> bytes:
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements:
        conn.execute(statement)
    conn.close()
    return path.read_bytes()


def kvchat_database_at(path, steps: int) -> Database:
    db = Database(sqlite3.connect(path, isolation_level=None))
    apply_migrations(db, MIGRATIONS[:steps])
    return db


def schema(db: Database) -> list[tuple]:
    return sorted(db.execute("SELECT type, name, sql FROM sqlite_schema").fetchall(), key=str)


def assert_refused_everywhere(home, capsys, reason: str) -> None:
    """Opening for writing, for reading, and `kvchat list`: the same sentence, and the file unchanged."""
    path = home / "kvchat.db"
    before = path.read_bytes()
    for write in (True, False):
        with pytest.raises(StorageError) as refused:
            ConversationStore.open(write=write)
        assert str(refused.value) == f"{path} {reason}; {REFUSED_TAIL}"
    assert main(["list"]) == 1
    assert capsys.readouterr().err == f"kvchat: {path} {reason}; {REFUSED_TAIL}\n"
    assert path.read_bytes() == before


def test_another_programs_database_with_a_conversations_table_is_refused_and_never_written(kvchat_home, capsys):
    another_programs_database(kvchat_home / "kvchat.db",
                              "CREATE TABLE conversations (id INTEGER PRIMARY KEY, body TEXT)",
                              "INSERT INTO conversations (body) VALUES ('not ours')")
    assert_refused_everywhere(kvchat_home, capsys, "is not a kvchat conversation database (it holds tables "
                                                   "kvchat did not make: conversations)")


def test_a_database_another_application_marked_as_its_own_is_refused(kvchat_home, capsys):
    another_programs_database(kvchat_home / "kvchat.db", "PRAGMA application_id = 1598903374")  # "_MTN"
    assert_refused_everywhere(kvchat_home, capsys, "is not a kvchat conversation database (another application "
                                                   "marked it as its own: application_id 0x5f4d544e)")


def test_another_programs_migrations_table_is_refused(kvchat_home, capsys):
    another_programs_database(kvchat_home / "kvchat.db",
                              "CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT, applied TEXT)",
                              "INSERT INTO _migrations (name, applied) VALUES ('0001_initial', 'yesterday')")
    assert_refused_everywhere(kvchat_home, capsys, "is not a kvchat conversation database (its _migrations "
                                                   "table is another program's)")


def test_a_migrations_table_of_kvchats_shape_listing_none_of_its_steps_is_refused(kvchat_home, capsys):
    another_programs_database(kvchat_home / "kvchat.db",
                              "CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)",
                              "INSERT INTO _migrations VALUES ('0001_users', 0)", "CREATE TABLE users (id)")
    assert_refused_everywhere(kvchat_home, capsys, "is not a kvchat conversation database (its _migrations "
                                                   "table lists none of kvchat's upgrades)")


def test_a_search_index_without_its_upgrade_row_is_refused_before_any_step_is_applied(kvchat_home, capsys):
    db = kvchat_database_at(kvchat_home / "kvchat.db", 2)
    db.execute("CREATE VIRTUAL TABLE messages_fts USING fts5 (text)")
    db.close()
    assert_refused_everywhere(kvchat_home, capsys, (
        "already has messages_fts, which kvchat's upgrade 0003_message_search makes, though its record of upgrades "
        "(_migrations) does not list that step"))


def test_a_new_database_carries_kvchats_marks(kvchat_home):
    with ConversationStore.open() as store:
        assert marks(store.db) == (APPLICATION_ID, len(MIGRATIONS))


def test_an_older_kvchats_database_without_marks_is_recognised_and_marked(kvchat_home):
    db = kvchat_database_at(kvchat_home / "kvchat.db", 4)
    db.execute("PRAGMA application_id = 0")  # as a kvchat older than the marks left it
    db.execute("PRAGMA user_version = 0")
    db.close()
    with ConversationStore.open() as store:
        assert marks(store.db) == (APPLICATION_ID, len(MIGRATIONS))
    db = kvchat_database_at(kvchat_home / "kvchat.db", len(MIGRATIONS))  # already current: only marked
    db.execute("PRAGMA application_id = 0")
    db.close()
    with ConversationStore.open() as store:
        assert marks(store.db) == (APPLICATION_ID, len(MIGRATIONS))


@pytest.mark.parametrize("failing", range(len(MIGRATIONS)))
def test_each_upgrade_step_is_all_or_nothing(kvchat_home, failing):
    db = kvchat_database_at(kvchat_home / "kvchat.db", failing)
    before = (schema(db), marks(db))
    name, step = MIGRATIONS[failing]

    def step_that_fails_at_its_end(db):
        step(db)
        raise RuntimeError("killed mid-step")

    with pytest.raises(RuntimeError):
        apply_migrations(db, [*MIGRATIONS[:failing], (name, step_that_fails_at_its_end)])
    assert (schema(db), marks(db)) == before
    apply_migrations(db)  # and the next open applies it whole
    assert marks(db) == (APPLICATION_ID, len(MIGRATIONS))
