"""A damaged database is found when kvchat opens it for writing, before any work is lost: it opens
read-only, says so in one sentence, and nothing is ever written into it."""

import pytest

import storage.db.health
from storage.db.conversations import ConversationStore
from storage.db.files import database_path
from storage.errors import StorageError
from tests.storage.db.damaged_db import damage, fill


def damaged_sentence(home) -> str:
    return f"{database_path(home)} is damaged; kvchat opened it read-only; `kvchat db recover` salvages it."


def test_a_damaged_file_opens_read_only_with_one_sentence_and_is_never_written(kvchat_home):
    chains = fill(kvchat_home, conversations=10, messages=20)
    damage(kvchat_home, "messages", count=2)
    damaged_bytes = database_path(kvchat_home).read_bytes()

    with ConversationStore.open() as store:
        assert store.read_only_reason == damaged_sentence(kvchat_home)
        assert len(store.list()) == 10  # what can be read still reads
        first = next(iter(chains))
        for write in (lambda: store.create("m"), lambda: store.rename(first, "renamed"),
                      lambda: store.add_message(first, None, "user", "hello", 0, [1]), lambda: store.delete(first)):
            with pytest.raises(StorageError) as refused:
                write()
            assert str(refused.value) == damaged_sentence(kvchat_home)
    assert database_path(kvchat_home).read_bytes() == damaged_bytes


def test_a_damaged_search_index_page_is_found_when_the_chat_opens_not_at_the_first_write(kvchat_home):
    # Such a page used to pass the open and fail every later write, after the model had loaded.
    fill(kvchat_home, conversations=10, messages=20)
    damage(kvchat_home, "messages_fts_data", count=1, kind="internal")
    with ConversationStore.open() as store:
        assert store.read_only_reason == damaged_sentence(kvchat_home)


def test_opening_for_reading_does_not_check_and_reads_what_it_can(kvchat_home, monkeypatch):
    fill(kvchat_home, conversations=3, messages=4)
    damage(kvchat_home, "messages_fts_data", count=1, kind="internal")
    monkeypatch.setattr(storage.db.health, "problems", lambda *args: pytest.fail("list must not pay for a check"))
    with ConversationStore.open(write=False) as store:
        assert len(store.list()) == 3


def test_a_file_that_passed_is_checked_again_only_once_it_has_changed(kvchat_home, monkeypatch):
    chains = fill(kvchat_home, conversations=2, messages=2)
    checks = []
    real_problems = storage.db.health.problems
    monkeypatch.setattr(storage.db.health, "problems", lambda *args: checks.append(1) or real_problems(*args))

    ConversationStore.open().close()
    ConversationStore.open().close()  # the same file: the passed check stands
    assert len(checks) == 1
    with ConversationStore.open() as store:
        store.rename(next(iter(chains)), "changed")
    ConversationStore.open().close()
    assert len(checks) == 2


def test_damage_after_a_passed_check_is_found_once_the_file_changes(kvchat_home):
    fill(kvchat_home, conversations=10, messages=20)
    ConversationStore.open().close()  # passes, and is remembered
    damage(kvchat_home, "messages", count=1)  # what a tool writing into the file does: its mtime changes
    with ConversationStore.open() as store:
        assert store.read_only_reason == damaged_sentence(kvchat_home)
