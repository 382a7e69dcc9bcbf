"""Opening the database: migrations from every older version, several processes at once, and
files and failures the user can meet, each said as one sentence."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from sqlite_utils import Database

import storage.db.connection
import storage.db.open
from app.cli.main import main

from storage.db.conversations import ConversationStore
from storage.db.migrations import MIGRATIONS, apply_migrations
from storage.db.open import open_database
from storage.db.records import encode_token_ids
from storage.db.transaction import transaction
from storage.errors import StorageError
from tests.storage.db.conversation_writer import spawn, start_together

ALL_STEPS = [name for name, _ in MIGRATIONS]

# Rows as the current schema has them; a database of an older version gets the columns it has.
OLD_CONVERSATION = {
    "id": "0123456789ab", "title": "Herons", "model": "old-model", "system": "Be brief.",
    "params": json.dumps({"temperature": 0.7}), "active_leaf": "bbbbbbbbbbbb", "created_at": 1.0,
    "updated_at": 2.0, "token_fingerprint": "fp-1",
}
OLD_MESSAGES = [
    {"seq": 1, "id": "aaaaaaaaaaaa", "conversation_id": "0123456789ab", "parent_id": None, "role": "user",
     "text": "What is a heron?", "token_start": 0, "token_ids": encode_token_ids([1, 2, 70000]),
     "status": "complete", "created_at": 1.0, "updated_at": 1.0},
    {"seq": 2, "id": "bbbbbbbbbbbb", "conversation_id": "0123456789ab", "parent_id": "aaaaaaaaaaaa",
     "role": "assistant", "text": "A wading bird.", "token_start": 3, "token_ids": encode_token_ids([4, 5]),
     "status": "complete", "stats": json.dumps({"finish_reason": "stop", "ttft_ms": 12.5}),
     "finish_reason": "stop", "created_at": 2.0, "updated_at": 2.0},
]


def raw_database(home) -> Database:
    return Database(sqlite3.connect(home / "kvchat.db", isolation_level=None))


def applied_steps(db: Database) -> list[str]:
    return [row["name"] for row in db.query("SELECT name FROM _migrations ORDER BY rowid")]


def insert_rows_valid_at_its_version(db: Database) -> None:
    def insert(table: str, row: dict) -> None:
        columns = db[table].columns_dict
        db[table].insert({key: value for key, value in row.items() if key in columns})

    if db["conversations"].exists():
        has_messages = db["messages"].exists()
        insert("conversations", {**OLD_CONVERSATION, "active_leaf": OLD_CONVERSATION["active_leaf"] if has_messages else None})
        for message in OLD_MESSAGES if has_messages else []:
            insert("messages", message)


@pytest.mark.parametrize("version", range(len(MIGRATIONS)))
def test_a_database_from_every_older_version_upgrades_with_its_rows_intact(kvchat_home, version):
    db = raw_database(kvchat_home)
    apply_migrations(db, MIGRATIONS[:version])
    insert_rows_valid_at_its_version(db)
    db.close()

    with ConversationStore.open() as store:
        assert applied_steps(store.db) == ALL_STEPS
        if version < 1:
            assert store.list() == []
            return
        conversation = store.get("0123")
        assert (conversation.title, conversation.model, conversation.system, conversation.params) == (
            "Herons", "old-model", "Be brief.", {"temperature": 0.7})
        assert conversation.token_fingerprint == ("fp-1" if version >= 4 else None)
        assert conversation.chat_format is None  # written with its model's own chat template
        if version < 2:
            assert store.branch(conversation.id) == []
            return
        question, answer = store.branch(conversation.id)
        assert (question.text, question.token_ids, answer.parent_id) == ("What is a heron?", [1, 2, 70000], question.id)
        assert (answer.token_ids, answer.stats, answer.writer_pid) == ([4, 5], {"finish_reason": "stop", "ttft_ms": 12.5}, None)
        # Messages older than the search index are indexed by the step that creates it.
        assert [hit.message_id for hit in store.search("heron")] == [question.id]
        # And the upgraded database takes new messages.
        reply = store.add_message(conversation.id, answer.id, "user", "Where do herons live?", 5, [6])
        assert store.branch(conversation.id)[-1] == reply


def test_reopening_an_up_to_date_database_applies_nothing(kvchat_home):
    open_database(kvchat_home / "kvchat.db").db.close()
    db = raw_database(kvchat_home)
    first = list(db.query("SELECT name, applied_at FROM _migrations"))
    db.close()
    db = open_database(kvchat_home / "kvchat.db").db
    assert list(db.query("SELECT name, applied_at FROM _migrations")) == first


def test_a_database_from_a_newer_kvchat_is_refused(kvchat_home):
    db = open_database(kvchat_home / "kvchat.db").db
    db.execute("INSERT INTO _migrations (name, applied_at) VALUES ('0099_from_the_future', 0)")
    db.close()
    with pytest.raises(StorageError, match="made by a newer kvchat"):
        ConversationStore.open()


def test_two_processes_opening_a_new_database_at_once_apply_each_step_once(tmp_path):
    for attempt in range(3):  # the steps interleave differently each time
        home = tmp_path / f"home{attempt}"
        openers = [spawn(home, "open"), spawn(home, "open")]
        start_together(openers)
        for opener in openers:
            _, errors = opener.communicate()
            assert opener.returncode == 0, errors
        db = raw_database(home)
        assert applied_steps(db) == ALL_STEPS  # the primary key allows no step twice
        db.close()


def test_a_step_another_process_applied_meanwhile_is_not_applied_again(kvchat_home):
    path = kvchat_home / "kvchat.db"
    applied_here = []
    steps = [(name, lambda db, name=name: applied_here.append(name)) for name, _ in MIGRATIONS]

    def other_process_migrates_first(sql, params):
        # Runs just before this connection's first BEGIN IMMEDIATE, after it has seen no steps.
        if sql == "BEGIN IMMEDIATE" and not applied_here and not path.with_suffix(".done").exists():
            path.with_suffix(".done").touch()
            open_database(path).db.close()

    db = Database(sqlite3.connect(path, isolation_level=None), tracer=other_process_migrates_first)
    apply_migrations(db, steps)
    assert applied_here == []
    assert applied_steps(db) == ALL_STEPS


def test_a_file_that_is_not_a_database_is_refused_and_left_untouched(kvchat_home):
    path = kvchat_home / "kvchat.db"
    garbage = bytes(range(256)) * 64
    path.write_bytes(garbage)
    with pytest.raises(StorageError, match="damaged") as refused:
        ConversationStore.open()
    assert str(path) in str(refused.value)
    assert path.read_bytes() == garbage


def test_a_data_dir_that_cannot_be_created_is_one_sentence(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StorageError, match="Cannot create the folder"):
        ConversationStore.open(tmp_path / "a-file" / "kvchat")


def test_a_transaction_that_raises_leaves_the_last_good_state(kvchat_home):
    with ConversationStore.open() as store:
        kept = store.create("m", title="kept")
        with pytest.raises(RuntimeError):
            with transaction(store.db):
                store.db.execute("UPDATE conversations SET title = 'lost'")
                store.db.execute("DELETE FROM conversations")
                raise RuntimeError("interrupted")
        assert store.list() == [kept]


def test_a_write_that_fills_the_disk_is_rolled_back_and_the_store_keeps_working(kvchat_home):
    with ConversationStore.open() as store:
        conversation = store.create("m")
        earlier = None
        for i in range(5):
            earlier = store.add_message(conversation.id, earlier and earlier.id, "user", f"message {i}", i, [i])
        before = store.branch(conversation.id)
        # Room for a few small pages more, not for a megabyte.
        pages = store.db.execute("PRAGMA page_count").fetchone()[0]
        store.db.execute(f"PRAGMA max_page_count = {pages + 8}")

        with pytest.raises(StorageError, match=r"^The disk is full: the message was not saved\.$"):
            store.add_message(conversation.id, earlier.id, "assistant", "word " * 200_000, 5, list(range(50_000)))

        assert store.branch(conversation.id) == before
        after = store.add_message(conversation.id, earlier.id, "assistant", "short", 5, [5])
    with ConversationStore.open() as store:
        assert store.branch(conversation.id) == [*before, after]
        assert store.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_lock_held_past_the_busy_timeout_is_one_sentence(kvchat_home):
    with ConversationStore.open() as store:
        conversation = store.create("m")
        store.db.execute("PRAGMA busy_timeout = 0")  # instead of waiting 10 s for the other writer
        other = sqlite3.connect(kvchat_home / "kvchat.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageError, match="locked.*: the new title was not saved"):
            store.rename(conversation.id, "renamed")
        other.execute("ROLLBACK")
        other.close()
        store.rename(conversation.id, "renamed")
        assert store.get(conversation.id).title == "renamed"


# What goes wrong around the file, each its own sentence, and reading that goes on regardless.


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def a_conversation_with_a_dead_streaming_reply(home) -> str:
    """Opening it for writing has work to do (the reply is to be marked interrupted), so a lock
    held by another kvchat makes that work wait."""
    with ConversationStore.open(home) as store:
        conversation = store.create("m", title="herons")
        question = store.add_message(conversation.id, None, "user", "What is a heron?", 0, [1])
        reply = store.add_message(conversation.id, question.id, "assistant", "A wading", 1, [2], status="streaming")
        store.db.execute("UPDATE messages SET writer_pid = ? WHERE id = ?", [dead_pid(), reply.id])
    return conversation.id


@pytest.mark.parametrize("lock", ["IMMEDIATE", "EXCLUSIVE"])
def test_another_kvchats_write_lock_does_not_stop_kvchat_list(kvchat_home, monkeypatch, capsys, lock):
    conversation_id = a_conversation_with_a_dead_streaming_reply(kvchat_home)
    monkeypatch.setattr(storage.db.open, "BUSY_TIMEOUT_S", 0.2)  # what a writer would wait; the list must not
    monkeypatch.setattr(storage.db.connection, "BUSY_TIMEOUT_S", 0.2)
    other = sqlite3.connect(kvchat_home / "kvchat.db", isolation_level=None)
    other.execute(f"BEGIN {lock}")
    other.execute("UPDATE conversations SET title = 'being renamed'")
    try:
        assert main(["list"]) == 0
        assert main(["show", conversation_id]) == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    out = capsys.readouterr().out
    assert f"{conversation_id}  " in out and "A wading" in out


def test_another_kvchats_write_lock_does_not_stop_the_chat_from_opening(kvchat_home, monkeypatch):
    conversation_id = a_conversation_with_a_dead_streaming_reply(kvchat_home)
    monkeypatch.setattr(storage.db.open, "BUSY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(storage.db.connection, "BUSY_TIMEOUT_S", 0.2)
    other = sqlite3.connect(kvchat_home / "kvchat.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with ConversationStore.open() as store:  # marking the reply waits for the lock, then gives up
            assert store.read_only_reason is None
            assert [m.text for m in store.branch(conversation_id)] == ["What is a heron?", "A wading"]
    finally:
        other.execute("ROLLBACK")
        other.close()


def pretend_the_folder_is_read_only(monkeypatch) -> list[str]:
    """What a read-only mount or a folder without write permission looks like to kvchat (tests run
    as root, which writes through permissions). Returns the URIs SQLite is asked to open."""
    monkeypatch.setattr(storage.db.connection, "folder_writable", lambda folder: False)
    opened = []
    real_connect = sqlite3.connect

    def recording_connect(database, *args, **kwargs):
        opened.append(str(database))
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", recording_connect)
    return opened


def test_a_read_only_data_folder_still_lists_shows_searches_and_exports(kvchat_home, monkeypatch, capsys):
    with ConversationStore.open() as store:
        conversation = store.create("m", title="herons")
        store.add_message(conversation.id, None, "user", "Where do herons nest?", 0, [1, 2])
    opened = pretend_the_folder_is_read_only(monkeypatch)

    for command in (["list"], ["show", conversation.id[:6]], ["search", "nest"],
                    ["export", conversation.id, "--format", "json"]):
        assert main(command) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.count(conversation.id) >= 3 and "Where do herons nest?" in out
    # Opened as SQLite can in a folder it cannot write: read-only and immutable (no -shm to make).
    assert opened and all(uri.endswith("?mode=ro&immutable=1") for uri in opened)
    assert [p.name for p in kvchat_home.iterdir()] == ["kvchat.db"]  # nothing written beside it


def test_the_chat_in_a_read_only_folder_opens_read_only_and_every_write_says_why(kvchat_home, monkeypatch):
    with ConversationStore.open() as store:
        conversation = store.create("m", title="herons")
    pretend_the_folder_is_read_only(monkeypatch)
    with ConversationStore.open() as store:
        assert store.read_only_reason == (f"The folder {kvchat_home} is read-only; kvchat opened kvchat.db "
                                          "read-only (nothing new is saved).")
        assert store.list() == [store.get(conversation.id)]
        for write in (lambda: store.create("m"), lambda: store.rename(conversation.id, "egrets"),
                      lambda: store.add_message(conversation.id, None, "user", "hi", 0, [1])):
            with pytest.raises(StorageError) as refused:
                write()
            assert str(refused.value) == store.read_only_reason


def test_a_database_of_an_older_kvchat_in_a_read_only_folder_is_read_through_a_migrated_copy(kvchat_home, monkeypatch):
    db = raw_database(kvchat_home)
    apply_migrations(db, MIGRATIONS[:4])
    insert_rows_valid_at_its_version(db)
    db.close()
    before = (kvchat_home / "kvchat.db").read_bytes()
    pretend_the_folder_is_read_only(monkeypatch)
    with ConversationStore.open(write=False) as store:
        assert [m.text for m in store.branch("0123")] == ["What is a heron?", "A wading bird."]
        assert [hit.message_id for hit in store.search("heron")] == ["aaaaaaaaaaaa"]
    assert (kvchat_home / "kvchat.db").read_bytes() == before


def test_reading_before_any_conversation_exists_creates_nothing(tmp_path):
    with ConversationStore.open(tmp_path / "new", write=False) as store:
        assert store.list() == []
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize("command", ["list", "rename"])
def test_a_database_path_that_is_not_a_file_is_one_sentence_not_a_hang(kvchat_home, kind, command):
    path = kvchat_home / "kvchat.db"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    args = ["list"] if command == "list" else ["rename", "0123", "new title"]
    result = subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=60)
    noun = "a named pipe (FIFO)" if kind == "fifo" else "a folder"
    assert result.returncode == 1
    assert result.stderr == (f"kvchat: {path} is {noun}, not a database file: move it away, or set KVCHAT_HOME "
                             "to another folder.\n")


def test_a_full_disk_when_opening_says_so_and_not_to_move_the_database_aside(kvchat_home, monkeypatch):
    db = raw_database(kvchat_home)
    db.execute("PRAGMA journal_mode=WAL")  # as every kvchat keeps it
    apply_migrations(db, MIGRATIONS[:4])  # an upgrade to apply: opening has to write
    insert_rows_valid_at_its_version(db)
    db.close()
    before = (kvchat_home / "kvchat.db").read_bytes()
    real_connect = sqlite3.connect

    def connect_on_a_full_disk(database, *args, **kwargs):
        conn = real_connect(database, *args, **kwargs)
        if "mode=ro" not in str(database):  # not one page more than the file has
            conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect_on_a_full_disk)
    with pytest.raises(StorageError) as refused:
        ConversationStore.open()
    assert str(refused.value) == (f"The disk is full: kvchat could not open {kvchat_home / 'kvchat.db'} for writing; "
                                  "free some space and start again (nothing in it was changed).")
    assert (kvchat_home / "kvchat.db").read_bytes() == before


HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")  # its commits stay in the -wal
conn.execute("UPDATE conversations SET title = 'written by the other kvchat'")
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_write_ahead_log_removed_under_another_kvchat_is_its_own_sentence_and_loses_nothing(kvchat_home):
    with ConversationStore.open() as store:
        conversation = store.create("m", title="herons")
    path = kvchat_home / "kvchat.db"
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "ready\n"
        (kvchat_home / "kvchat.db-wal").unlink()
        with pytest.raises(StorageError) as refused:
            ConversationStore.open()
        assert str(refused.value) == (
            f"{path}-wal was removed while another kvchat had the database open: quit that kvchat (it still holds "
            "the latest changes and writes them back as it exits), then try again (the conversations are intact).")
    finally:
        other.communicate("quit\n", timeout=30)
    with ConversationStore.open() as store:  # as the sentence says
        assert store.get(conversation.id).title == "written by the other kvchat"


# Run in a child process: before the fix, closing the database while another thread read it crashed the
# whole process (a segmentation fault in the sqlite3 module), as a chat quitting while its engine thread
# still read a conversation's history did in CI.
_CLOSE_UNDER_A_READER = """
import sys, tempfile, threading
from pathlib import Path
from storage.db.conversations import ConversationStore
from storage.errors import StorageError
folder = Path(tempfile.mkdtemp())
outcomes = set()
for _ in range(40):
    store = ConversationStore.open(folder)
    conversation = store.create("m")
    store.add_message(conversation.id, None, "user", "hi" * 50, 0, [1, 2, 3])
    def read():
        try:
            while True:
                store.list()
                store.branch(conversation.id)
        except StorageError as error:
            outcomes.add(str(error))
    reader = threading.Thread(target=read)
    reader.start()
    store.close()
    reader.join()
print(sorted(outcomes))
"""


def test_closing_the_database_under_a_reading_thread_stops_the_reader_with_a_sentence(tmp_path):
    result = subprocess.run([sys.executable, "-c", _CLOSE_UNDER_A_READER], capture_output=True, text=True,
                            timeout=120, cwd=os.getcwd())
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['The conversation database was closed: kvchat is shutting down.']"
