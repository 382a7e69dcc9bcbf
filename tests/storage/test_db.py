"""Opening the database: migrations from every older version, several processes at once, and
files and failures the user can meet, each said as one sentence."""

import json
import sqlite3

import pytest
from sqlite_utils import Database

from storage.conversations import ConversationStore
from storage.records import encode_token_ids
from storage.db import StorageError, open_database, transaction
from storage.migrations import MIGRATIONS, apply_migrations
from tests.storage.conversation_writer import spawn, start_together

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
    open_database(kvchat_home / "kvchat.db").close()
    db = raw_database(kvchat_home)
    first = list(db.query("SELECT name, applied_at FROM _migrations"))
    db.close()
    db = open_database(kvchat_home / "kvchat.db")
    assert list(db.query("SELECT name, applied_at FROM _migrations")) == first


def test_a_database_from_a_newer_kvchat_is_refused(kvchat_home):
    db = open_database(kvchat_home / "kvchat.db")
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
            open_database(path).close()

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
