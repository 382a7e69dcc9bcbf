"""ConversationStore: conversations, message trees, search and recovery of interrupted replies."""

import os
import sqlite3
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.db.conversations import ConversationStore
from storage.errors import StorageError
from tests.examples import examples


@pytest.fixture
def store(kvchat_home):
    with ConversationStore.open() as store:
        yield store


def add_turns(store, conversation_id, *texts, parent_id=None):
    """Messages alternating user/assistant, each the reply to the one before; returns them."""
    messages = []
    for i, text in enumerate(texts):
        parent_id = store.add_message(conversation_id, parent_id, ("user", "assistant")[i % 2], text, i, [i]).id
        messages.append(store.message(parent_id))
    return messages


def insert_conversation(store, conversation_id):
    store.db.execute("INSERT INTO conversations (id, model, created_at, updated_at) VALUES (?, 'm', 0, 0)",
                     [conversation_id])


# Conversations


def test_the_store_lives_in_the_data_dir(kvchat_home, store):
    assert (kvchat_home / "kvchat.db").exists()


def test_a_created_conversation_reads_back_the_same(store):
    created = store.create("smollm2", system="Be brief.", params={"temperature": 0.2, "seed": 7})
    assert len(created.id) == 12 and int(created.id, 16) >= 0
    assert (created.title, created.active_leaf, created.token_fingerprint) == ("", None, None)
    assert store.get(created.id) == created


def test_list_puts_the_latest_activity_first_and_pages(store):
    first, second, third = (store.create("m") for _ in range(3))
    add_turns(store, first.id, "bump the oldest")
    assert [c.id for c in store.list()] == [first.id, third.id, second.id]
    assert [c.id for c in store.list(limit=2)] == [first.id, third.id]
    assert [c.id for c in store.list(limit=2, offset=2)] == [second.id]


def test_list_never_reads_the_messages_table(store):
    conversation = store.create("m")
    add_turns(store, conversation.id, "hello", "hi")
    read = set()

    def record(action, table, *_):
        if action == sqlite3.SQLITE_READ:
            read.add(table)
        return sqlite3.SQLITE_OK

    store.db.conn.set_authorizer(record)
    store.list()
    store.db.conn.set_authorizer(None)
    assert "conversations" in read and "messages" not in read


def test_rename_sets_the_title(store):
    conversation = store.create("m")
    store.rename(conversation.id, "  Herons  ")
    assert store.get(conversation.id).title == "Herons"


def test_update_settings_changes_only_the_fields_given(store):
    conversation = store.create("m", system="Be brief.", params={"temperature": 0.2})
    store.update_settings(conversation.id, model="other", token_fingerprint="fp")
    changed = store.get(conversation.id)
    assert (changed.model, changed.system, changed.params, changed.token_fingerprint) == (
        "other", "Be brief.", {"temperature": 0.2}, "fp")
    store.update_settings(conversation.id, system=None, params={"top_p": 0.9})
    changed = store.get(conversation.id)
    assert (changed.model, changed.system, changed.params) == ("other", None, {"top_p": 0.9})


def test_delete_removes_the_conversation_its_messages_and_their_search_entries(store):
    doomed, kept = store.create("m"), store.create("m")
    add_turns(store, doomed.id, "herons wade", "yes they do")
    add_turns(store, kept.id, "egrets wade")
    store.delete(doomed.id[:6])
    assert store.list() == [store.get(kept.id)]
    assert store.db.execute("SELECT count(*) FROM messages").fetchone() == (1,)
    assert store.db.execute("SELECT count(*) FROM messages_fts_docsize").fetchone() == (1,)
    assert [hit.conversation_id for hit in store.search("wade")] == [kept.id]
    with pytest.raises(StorageError, match="No conversation matches"):
        store.get(doomed.id)


def test_a_unique_prefix_of_four_or_more_characters_names_a_conversation(store):
    conversation = store.create("m")
    assert store.resolve_id(conversation.id[:4]) == conversation.id
    assert store.resolve_id(conversation.id.upper()) == conversation.id
    assert store.get(conversation.id[:7]) == conversation


def test_a_prefix_shared_by_several_conversations_asks_for_more(store):
    for suffix in ("00000000", "11111111", "22222222"):
        insert_conversation(store, "abcd" + suffix)
    with pytest.raises(StorageError, match=r"^'abcd' matches 3 conversations; give more of the id\.$"):
        store.get("abcd")
    assert store.resolve_id("abcd1") == "abcd11111111"


@pytest.mark.parametrize("wrong", ["ffff", "ffffffffffff", "zzzz", "abc*", "%%%%"])
def test_an_id_matching_no_conversation_is_one_sentence(store, wrong):
    insert_conversation(store, "abcd00000000")
    with pytest.raises(StorageError, match=rf"^No conversation matches '{wrong}'\.$".replace("*", r"\*")):
        store.get(wrong)


def test_a_prefix_under_four_characters_is_refused(store):
    store.create("m")
    with pytest.raises(StorageError, match="at least 4 characters"):
        store.get("abc")


# Messages


@pytest.mark.parametrize("token_ids", [[], [0], [1, 65535, 65536, 151_643, 2**31 - 1]])
def test_token_ids_read_back_exactly(store, token_ids):
    conversation = store.create("m")
    message = store.add_message(conversation.id, None, "user", "hi", 0, token_ids)
    assert store.message(message.id).token_ids == token_ids
    assert store.db.execute("SELECT length(token_ids) FROM messages").fetchone() == (4 * len(token_ids),)


def test_a_stored_message_reads_back_the_same(store):
    conversation = store.create("m")
    stats = {"ttft_ms": 12.5, "decode_tokens_per_s": 80.0, "finish_reason": "length", "cache_source": "disk"}
    message = store.add_message(conversation.id, None, "assistant", "hi", 3, [1, 2], status="stopped", stats=stats)
    assert store.message(message.id) == message
    assert (message.stats, message.status, message.writer_pid) == (stats, "stopped", None)
    assert store.db.execute("SELECT finish_reason FROM messages").fetchone() == ("length",)


def test_adding_a_message_makes_it_the_active_leaf_and_bumps_the_conversation(store):
    older, newer = store.create("m"), store.create("m")
    message = store.add_message(older.id, None, "user", "hi", 0, [1])
    assert store.get(older.id).active_leaf == message.id
    assert store.list()[0].id == older.id != newer.id


def test_update_message_changes_only_the_fields_given(store):
    conversation = store.create("m")
    reply = store.add_message(conversation.id, None, "assistant", "Hel", 0, [1], status="streaming")
    assert reply.writer_pid == os.getpid()
    store.update_message(reply.id, text="Hello")
    assert (store.message(reply.id).text, store.message(reply.id).token_ids) == ("Hello", [1])
    store.update_message(reply.id, token_ids=[1, 2], status="complete", stats={"finish_reason": "stop"})
    done = store.message(reply.id)
    assert (done.text, done.token_ids, done.status, done.stats) == ("Hello", [1, 2], "complete", {"finish_reason": "stop"})
    assert store.db.execute("SELECT finish_reason FROM messages").fetchone() == ("stop",)


def test_updating_a_message_moves_its_conversation_to_the_top(store):
    streaming = store.create("m")
    reply = store.add_message(streaming.id, None, "assistant", "", 0, [], status="streaming")
    other = store.create("m")
    assert store.list()[0].id == other.id
    store.update_message(reply.id)  # heartbeat
    assert store.list()[0].id == streaming.id


def test_a_parent_from_another_conversation_is_refused_and_nothing_is_stored(store):
    here, elsewhere = store.create("m"), store.create("m")
    (foreign,) = add_turns(store, elsewhere.id, "hi")
    with pytest.raises(StorageError, match="is not in conversation"):
        store.add_message(here.id, foreign.id, "assistant", "hello", 1, [2])
    assert store.all_messages(here.id) == [] and store.get(here.id).active_leaf is None


def test_an_unknown_message_is_one_sentence(store):
    with pytest.raises(StorageError, match=r"^No message has the id 'ffffffffffff'\.$"):
        store.update_message("ffffffffffff", text="x")


# Titles


def test_the_first_user_message_titles_the_conversation(store):
    conversation = store.create("m")
    add_turns(store, conversation.id, "  How   do herons\tfish?\nI saw one today.", "Patiently.", "And egrets?")
    assert store.get(conversation.id).title == "How do herons fish?"


def test_a_long_first_message_is_cut_with_an_ellipsis(store):
    conversation = store.create("m")
    add_turns(store, conversation.id, "word " * 40)
    title = store.get(conversation.id).title
    assert len(title) <= 60 and title.endswith("word…")


def test_a_given_title_is_kept(store):
    conversation = store.create("m", title="Mine")
    add_turns(store, conversation.id, "hello")
    assert store.get(conversation.id).title == "Mine"


# Branches


@pytest.fixture
def tree(store):
    """u1 -> a1 -> u2 -> a2, then a2 regenerated (a2b), then u2 edited (u2b) and answered (a3)."""
    conversation = store.create("m")
    u1, a1, u2, a2 = add_turns(store, conversation.id, "u1", "a1", "u2", "a2")
    a2b = store.add_message(conversation.id, u2.id, "assistant", "a2b", 3, [3])
    u2b = store.add_message(conversation.id, a1.id, "user", "u2b", 2, [2])
    a3 = store.add_message(conversation.id, u2b.id, "assistant", "a3", 3, [3])
    return conversation.id, dict(u1=u1, a1=a1, u2=u2, a2=a2, a2b=a2b, u2b=u2b, a3=a3)


def texts(messages):
    return [m.text for m in messages]


def test_the_branch_follows_the_latest_message(store, tree):
    conversation_id, _ = tree
    assert texts(store.branch(conversation_id)) == ["u1", "a1", "u2b", "a3"]


def test_edits_and_regenerations_are_siblings(store, tree):
    _, m = tree
    assert texts(store.children(m["a1"].id)) == ["u2", "u2b"]
    assert texts(store.children(m["u2"].id)) == ["a2", "a2b"]
    assert texts(store.siblings(m["a2b"].id)) == ["a2", "a2b"]
    assert store.children(m["a3"].id) == []


def test_all_messages_holds_every_branch_parents_first(store, tree):
    conversation_id, m = tree
    assert store.all_messages(conversation_id) == list(m.values())


def test_set_active_leaf_switches_the_branch(store, tree):
    conversation_id, m = tree
    store.set_active_leaf(conversation_id, m["a2"].id)
    assert texts(store.branch(conversation_id)) == ["u1", "a1", "u2", "a2"]
    assert texts(store.branch(conversation_id, leaf=m["a2b"].id)) == ["u1", "a1", "u2", "a2b"]


def test_latest_leaf_is_the_most_recently_updated_end_below_a_message(store, tree):
    _, m = tree
    assert store.latest_leaf(m["u2"].id) == m["a2b"].id
    assert store.latest_leaf(m["u1"].id) == m["a3"].id
    store.update_message(m["a2"].id, status="stopped")
    assert store.latest_leaf(m["u2"].id) == m["a2"].id
    assert store.latest_leaf(m["a3"].id) == m["a3"].id


def test_an_edited_first_message_starts_a_sibling_root(store, tree):
    conversation_id, m = tree
    u1b = store.add_message(conversation_id, None, "user", "u1b", 0, [0])
    assert texts(store.siblings(m["u1"].id)) == ["u1", "u1b"]
    assert store.branch(conversation_id) == [u1b]


def test_a_message_of_another_conversation_is_no_leaf_here(store, tree):
    conversation_id, m = tree
    other = store.create("m")
    with pytest.raises(StorageError, match="is not in conversation"):
        store.branch(other.id, leaf=m["a3"].id)
    with pytest.raises(StorageError, match="is not in conversation"):
        store.set_active_leaf(other.id, m["a3"].id)
    assert store.get(other.id).active_leaf is None


def test_a_long_conversation_loads_its_branch_in_order(store):
    conversation = store.create("m")
    messages = add_turns(store, conversation.id, *(f"turn {i}" for i in range(500)))
    assert store.branch(conversation.id) == messages


# Search


def test_search_finds_words_in_any_conversation(store):
    herons, egrets = store.create("m"), store.create("m")
    (question,) = add_turns(store, herons.id, "Where do grey herons nest?")
    add_turns(store, egrets.id, "Egrets are white.", "Herons are usually grey.")
    hits = store.search("grey HERONS")
    assert {hit.conversation_id for hit in hits} == {herons.id, egrets.id}
    first = next(hit for hit in hits if hit.message_id == question.id)
    assert (first.title, first.role, first.snippet) == ("Where do grey herons nest?", "user", "Where do grey herons nest?")
    assert store.search("penguin") == []


def test_search_ranks_by_relevance_then_newest(store):
    conversation = store.create("m")
    once, twice, newer_once = add_turns(store, conversation.id, "heron and a lot of other words here",
                                        "heron heron", "heron and a lot of other words here")
    assert [hit.message_id for hit in store.search("heron")] == [twice.id, newer_once.id, once.id]


def test_search_snippets_are_cut_around_the_match(store):
    conversation = store.create("m")
    add_turns(store, conversation.id, " ".join(f"filler{i}" for i in range(100)) + " heron " + "tail " * 100)
    snippet = store.search("heron")[0].snippet
    assert "heron" in snippet and snippet.startswith("…") and snippet.endswith("…") and len(snippet) < 200


def test_search_sees_updates_and_deletes(store):
    conversation = store.create("m")
    (reply,) = add_turns(store, conversation.id, "draft about herons")
    store.update_message(reply.id, text="final about egrets")
    assert store.search("herons") == []
    assert [hit.message_id for hit in store.search("egrets")] == [reply.id]
    store.delete(conversation.id)
    assert store.search("egrets") == []


@pytest.mark.parametrize("query", ['"', '""', "'", "*", "heron*", "AND", "OR NOT", "-", "-heron", "a -b",
                                   "NEAR(heron wading)", "text:heron", "^heron", "(", ")", "{heron}", "\x00",
                                   'a\n"b\nc"', "héron", "日本語", "🐦", "heron AND", "  "])
def test_search_takes_any_text(store, query):
    conversation = store.create("m")
    add_turns(store, conversation.id, "A heron is wading, this AND that. 日本語 🐦")
    store.search(query)


def test_search_words_are_words_not_operators(store):
    conversation = store.create("m")
    (message,) = add_turns(store, conversation.id, "A heron is wading, this AND that.")
    for query in ["AND", "heron*", "héron", "-heron", "HERON:"]:
        assert [hit.message_id for hit in store.search(query)] == [message.id], query
    assert store.search("heron NOT") == []  # every word must be there; NOT is a word


# One store serves every example: searching does not change it.
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text())
def test_search_never_fails_on_any_text(store, query):
    if not store.list():
        add_turns(store, store.create("m").id, "A heron is wading.")
    store.search(query)


# Recovery of replies whose writer died


def streaming_reply(store, writer_pid, updated_at=None):
    conversation = store.create("m")
    (question,) = add_turns(store, conversation.id, "hello")
    reply = store.add_message(conversation.id, question.id, "assistant", "partial text", 1, [7], status="streaming")
    store.db.execute("UPDATE messages SET writer_pid = ?, updated_at = coalesce(?, updated_at) WHERE id = ?",
                     [writer_pid, updated_at, reply.id])
    return reply


def gone_pid():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


def test_a_reply_whose_writer_is_gone_becomes_interrupted_with_its_text(store):
    reply = streaming_reply(store, gone_pid())
    assert store.replies.recover_interrupted() == 1
    recovered = store.message(reply.id)
    assert (recovered.status, recovered.text, recovered.token_ids) == ("interrupted", "partial text", [7])
    assert store.replies.recover_interrupted() == 0


def test_a_reply_streamed_by_a_live_process_is_left_alone(store):
    reply = streaming_reply(store, os.getpid())
    assert store.replies.recover_interrupted() == 0
    assert store.message(reply.id).status == "streaming"


def test_a_reply_silent_for_over_an_hour_is_interrupted_even_if_its_pid_lives(store):
    reply = streaming_reply(store, os.getpid(), updated_at=time.time() - 2 * 3600)
    assert store.replies.recover_interrupted() == 1
    assert store.message(reply.id).status == "interrupted"


def test_opening_the_store_recovers_interrupted_replies(kvchat_home):
    with ConversationStore.open() as store:
        reply = streaming_reply(store, gone_pid())
    with ConversationStore.open() as store:
        assert store.message(reply.id).status == "interrupted"
