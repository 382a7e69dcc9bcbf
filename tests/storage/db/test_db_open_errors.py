"""Each way opening the database can fail is one sentence, for the chat (ConversationStore.open) and for
`kvchat list` (exit 1): a lock another program or another kvchat holds, a file that cannot be opened,
a read-only file SQLite must write, access denied, a disk I/O error. Another application's `_migrations`
table: test_db_identity.py."""

import sqlite3
import subprocess
import sys

import pytest

import storage.db.connection
import storage.db.open
from app.cli.main import main
from storage.db.conversations import ConversationStore
from storage.db.turn_lock import TurnLock
from storage.errors import StorageError

# A connection in exclusive locking mode keeps its lock (and WAL index) to itself: no other connection can
# read the file until it ends, as a program that opened the database this way would.
EXCLUSIVE_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("UPDATE conversations SET title = title")
print("ready", flush=True)
sys.stdin.readline()
"""


def refused(capsys) -> str:
    """The sentence opening the database for writing and `kvchat list` both say (the same one)."""
    with pytest.raises(StorageError) as opening:
        ConversationStore.open()
    assert main(["list"]) == 1
    assert capsys.readouterr().err == f"kvchat: {opening.value}\n"
    return str(opening.value)


@pytest.fixture
def database(kvchat_home):
    with ConversationStore.open() as store:
        store.create("m", title="herons")
    return kvchat_home / "kvchat.db"


@pytest.fixture
def short_busy_timeout(monkeypatch):
    """What a writer would wait for another's lock, 0.2 s instead of 10 s."""
    monkeypatch.setattr(storage.db.open, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(storage.db.connection, "BUSY_TIMEOUT_S", 0.2)


@pytest.mark.parametrize("turn", [False, True], ids=["another program", "another kvchat's turn"])
def test_a_database_another_process_holds_locked_is_one_sentence_naming_who_if_known(database, capsys,
                                                                                     short_busy_timeout, turn):
    holder = subprocess.Popen([sys.executable, "-c", EXCLUSIVE_HOLDER, str(database)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    turn_lock = TurnLock(database.parent, "0123456789ab")
    try:
        assert holder.stdout.readline() == "ready\n"
        if turn:
            assert turn_lock.acquire()  # a kvchat writing a reply holds one (here this process, to the probe)
        who = "Another kvchat" if turn else "Another program"
        assert refused(capsys) == (f"{who} kept {database} locked for over 0 s, so kvchat could not open it; "
                                   "try again when it is done.")
    finally:
        turn_lock.release()
        holder.communicate("done\n", timeout=30)
    with ConversationStore.open() as store:  # and once it is done, as the sentence says
        assert [c.title for c in store.list()] == ["herons"]


def test_a_file_beside_the_database_that_cannot_be_opened_is_named_with_the_systems_reason(database, capsys):
    (database.parent / "kvchat.db-wal").mkdir()  # SQLite: "unable to open database file" (SQLITE_CANTOPEN)
    assert refused(capsys) == f"{database} cannot be opened (kvchat.db-wal: Is a directory)."


def sqlite_refusing(monkeypatch, code: int, message: str) -> None:
    """Every connection to kvchat.db fails as SQLite fails with `code`: for what root (who runs the tests)
    cannot meet for real, as permissions do not stop it and a failing disk cannot be made to order."""
    real_connect = sqlite3.connect

    def connect(database, *args, **kwargs):
        if "kvchat.db" in str(database):
            error = sqlite3.OperationalError(message)
            error.sqlite_errorcode, error.sqlite_errorname = code, "as SQLite names it"
            raise error
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)


@pytest.mark.parametrize("code, message, sentence", [
    (sqlite3.SQLITE_READONLY_RECOVERY, "attempt to write a readonly database",
     "cannot be opened: SQLite has to write to open it (to recover its write-ahead log, say), but the file, its "
     "-wal or -shm, or its folder is read-only."),
    (sqlite3.SQLITE_PERM, "access permission denied",
     "cannot be opened: the system denied access to it; check the permissions of the file and of its folder, and "
     "any security policy (SELinux, AppArmor)."),
    (sqlite3.SQLITE_CANTOPEN, "unable to open database file",
     "cannot be opened: check the permissions of the file, of its -wal and -shm, and of its folder."),
], ids=["read-only", "permission denied", "cannot open, the files open for us"])
def test_a_file_sqlite_cannot_open_is_one_sentence_by_cause(database, capsys, monkeypatch, code, message, sentence):
    sqlite_refusing(monkeypatch, code, message)
    assert refused(capsys) == f"{database} {sentence}"


def test_a_disk_io_error_while_opening_is_one_sentence(database, capsys, monkeypatch):
    sqlite_refusing(monkeypatch, sqlite3.SQLITE_IOERR_READ, "disk I/O error")
    assert refused(capsys) == (f"The disk could not be read or written (disk I/O error): {database} could not be "
                               "opened; check the disk.")
