"""`kvchat db recover` on databases damaged the same way every run: pages in the middle of a file
of several hundred messages overwritten with noise."""

import sqlite3

import pytest

from storage.db.conversations import ConversationStore
from storage.db.files import database_path
from storage.db.recover import RECOVERED_TITLE, recover
from storage.errors import StorageError
from tests.storage.db.damaged_db import damage, fill, pages_of


def all_ids(home) -> set[str]:
    with ConversationStore.open(home, write=False) as store:
        return {m.id for c in store.list() for m in store.all_messages(c.id)}


def test_recover_keeps_every_readable_message_and_roots_those_whose_parent_was_lost(kvchat_home):
    chains = fill(kvchat_home, conversations=30, messages=20)
    damage(kvchat_home, "messages", count=4)
    damaged_bytes = database_path(kvchat_home).read_bytes()

    result = recover(database_path(kvchat_home))

    kept = all_ids(kvchat_home)
    original = {m for chain in chains.values() for m in chain}
    assert kept < original and len(kept) >= len(original) - 8  # 4 pages of one or two messages
    assert (result.conversations, result.messages, result.adopted) == (30, len(kept), 0)
    assert result.lost == len(original) - len(kept)  # the indexes list every message there was
    with ConversationStore.open() as store:
        assert store.read_only_reason is None
        for conversation_id, chain in chains.items():
            for message_id, parent_id in zip(chain[1:], chain):
                if message_id in kept:
                    assert store.message(message_id).parent_id == (parent_id if parent_id in kept else None)
            assert store.branch(conversation_id)  # its active leaf is one of its messages
        survivor = store.message(sorted(kept)[0])  # the search index is rebuilt
        assert survivor.id in {hit.message_id for hit in store.search(" ".join(survivor.text.split()[:4]))}
        assert store.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert result.damaged_copy.read_bytes() == damaged_bytes  # moved aside, not changed
    assert result.damaged_copy.name.startswith("kvchat.db.damaged-")


def test_messages_whose_conversation_was_lost_go_under_a_recovered_conversation(kvchat_home):
    chains = fill(kvchat_home, conversations=30, messages=20)
    damage(kvchat_home, "conversations", count=1)  # the one page that holds them all

    result = recover(database_path(kvchat_home))

    assert (result.conversations, result.messages, result.adopted) == (0, 600, 600)
    with ConversationStore.open() as store:
        (recovered,) = store.list()
        assert recovered.title == RECOVERED_TITLE
        # Each conversation's chain is still a chain, now one branch of many under "(recovered)".
        first, *rest = chains.values()
        assert [m.id for m in store.branch(recovered.id, first[-1])] == first
        assert store.search("conversation 7 message 3")


def test_the_rows_after_a_damaged_interior_page_are_still_read(kvchat_home):
    fill(kvchat_home, conversations=80, messages=20)  # 800 leaf pages: more than one interior page
    interior = pages_of(database_path(kvchat_home), "messages", "internal")
    assert len(interior) >= 3  # the root and at least two below it
    damage(kvchat_home, "messages", count=1, kind="internal")  # not the root: one subtree goes

    result = recover(database_path(kvchat_home))

    with ConversationStore.open() as store:
        kept = {seq for (seq,) in store.db.execute("SELECT seq FROM messages")}
    lost = set(range(1, 1601)) - kept
    assert result.messages == len(kept) and result.lost == len(lost) > 0
    assert lost == set(range(min(lost), max(lost) + 1))  # the one subtree's rows
    assert max(lost) < 1600  # the reader went on past the damaged page


def test_a_file_with_nothing_readable_is_refused_and_left_in_place(kvchat_home):
    path = database_path(kvchat_home)
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(StorageError, match="too damaged to recover"):
        recover(path)
    assert path.read_bytes() == bytes(range(256)) * 64
    assert [p.name for p in kvchat_home.iterdir()] == ["kvchat.db"]


def test_recover_refuses_while_a_plain_sqlite3_reader_has_the_database_open(kvchat_home):
    fill(kvchat_home, conversations=2, messages=2)
    other = sqlite3.connect(database_path(kvchat_home))
    other.execute("SELECT count(*) FROM messages").fetchone()
    try:
        with pytest.raises(StorageError, match="Another program has .* open; quit it, then recover"):
            recover(database_path(kvchat_home))
    finally:
        other.close()
