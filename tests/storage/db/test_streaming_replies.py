"""A streaming reply's row and its appended parts: small writes, what readers see, how it ends or is recovered."""

import subprocess
import sys

import pytest

from storage.db.conversations import ConversationStore
from storage.db.streaming_replies import ReplyGone


@pytest.fixture
def store(kvchat_home):
    with ConversationStore.open() as store:
        yield store


def streaming(store, text="Hel"):
    conversation = store.create(model="m")
    question = store.add_message(conversation.id, None, "user", "hi", 0, [1, 2])
    reply = store.add_message(conversation.id, question.id, "assistant", text, 2, [7], status="streaming")
    return conversation, reply


def wal_bytes(kvchat_home) -> int:
    return (kvchat_home / "kvchat.db-wal").stat().st_size


def test_saving_a_long_reply_so_far_writes_no_more_than_saving_a_short_one(kvchat_home, store):
    # Rewriting the row and its search entry at every save wrote ~26 KB a save for a 400-token reply
    # (40 KB for 4,000 tokens) to the write-ahead log, which is what filled a nearly full disk.
    store.db.execute("PRAGMA wal_autocheckpoint = 0")  # count every byte written
    _, reply = streaming(store)
    for _ in range(300):  # a long reply: ~15 KB of text and ids, past one page
        store.replies.append_to_reply(reply.id, "some words ", [5, 6, 7])
    before = wal_bytes(kvchat_home)
    for _ in range(10):
        store.replies.append_to_reply(reply.id, "some words ", [5, 6, 7])
    per_save = (wal_bytes(kvchat_home) - before) / 10
    assert per_save <= 2 * 4096 + 100  # a page or two of the log, whatever the reply's length


def test_readers_see_a_streaming_reply_as_its_row_followed_by_its_parts(store):
    conversation, reply = streaming(store)
    store.replies.append_to_reply(reply.id, "lo", [8])
    store.replies.append_to_reply(reply.id, " world", [9, 10])
    for seen in (store.message(reply.id), store.branch(conversation.id)[-1], store.all_messages(conversation.id)[-1]):
        assert (seen.text, seen.token_ids, seen.status) == ("Hello world", [7, 8, 9, 10], "streaming")


def test_finishing_a_reply_writes_it_whole_and_drops_its_parts(store):
    conversation, reply = streaming(store)
    store.replies.append_to_reply(reply.id, "lo", [8])
    store.replies.finish_reply(reply.id, text="Hello!", token_ids=[7, 8, 9], status="complete", stats={"finish_reason": "stop"})
    done = store.message(reply.id)
    assert (done.text, done.token_ids, done.status, done.stats) == ("Hello!", [7, 8, 9], "complete",
                                                                    {"finish_reason": "stop"})
    assert store.db.execute("SELECT count(*) FROM stream_parts").fetchone()[0] == 0
    assert store.list()[0].updated_at == done.updated_at


def test_a_reply_is_searchable_once_it_no_longer_streams(store):
    conversation, reply = streaming(store, "")
    store.replies.append_to_reply(reply.id, "herons everywhere", [1])
    assert store.search("herons") == []
    store.replies.finish_reply(reply.id, text="herons everywhere", token_ids=[1], status="stopped", stats=None)
    assert [hit.message_id for hit in store.search("herons")] == [reply.id]
    store.delete(conversation.id)
    assert store.search("herons") == []
    assert store.db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')") is not None


def test_appending_to_a_reply_whose_conversation_was_deleted_raises_reply_gone(store):
    conversation, reply = streaming(store)
    store.delete(conversation.id)
    with pytest.raises(ReplyGone):
        store.replies.append_to_reply(reply.id, "more", [1])
    with pytest.raises(ReplyGone):
        store.replies.finish_reply(reply.id, text="x", token_ids=[1], status="complete", stats=None)
    assert store.db.execute("SELECT count(*) FROM stream_parts").fetchone()[0] == 0


def gone_pid():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


def test_a_reply_whose_writer_died_reads_as_interrupted_and_recovery_folds_its_parts(store):
    conversation, reply = streaming(store)
    store.replies.append_to_reply(reply.id, "lo", [8])
    store.db.execute("UPDATE messages SET writer_pid = ? WHERE id = ?", [gone_pid(), reply.id])
    seen = store.message(reply.id)  # before any recovery ran (e.g. a read-only folder)
    assert (seen.text, seen.status) == ("Hello", "interrupted")
    assert store.replies.recover_interrupted() == 1
    recovered = store.message(reply.id)
    assert (recovered.text, recovered.token_ids, recovered.status) == ("Hello", [7, 8], "interrupted")
    assert store.db.execute("SELECT count(*) FROM stream_parts").fetchone()[0] == 0
    assert [hit.message_id for hit in store.search("Hello")] == [reply.id]
    assert store.replies.recover_interrupted() == 0


def test_recovery_with_nothing_to_recover_writes_nothing(kvchat_home, store):
    streaming(store)  # ours, alive
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert store.replies.recover_interrupted() == 0
    assert wal_bytes(kvchat_home) == 0


def test_a_full_disk_is_one_sentence_and_keeps_what_was_written(store):
    _, reply = streaming(store)
    store.replies.append_to_reply(reply.id, "lo", [8])
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")  # no page more: SQLITE_FULL, as on a full disk
    with pytest.raises(Exception) as failure:
        for _ in range(2000):
            store.replies.append_to_reply(reply.id, "x" * 200, [1] * 50)
    assert str(failure.value).startswith("The disk is full: the reply so far was not saved")
    assert store.message(reply.id).text.startswith("Hello")
