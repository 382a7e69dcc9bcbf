"""A conversation takes one turn at a time, across processes, and a delete by another kvchat wins."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import app.chat.saved.reply_writer as reply_writer
from app.chat.session import ChatSession
from app.chat.saved.reply_writer import ConversationDeleted
from app.chat.saved.conversation import ConversationBusy, ConversationChanged, SavedConversation, Storage
from engine import Done, SamplingParams, TokenDelta
from tests.app.in_process_cli import kvchat
from tests.app.kv_blocks import block_files, conversation_kv

GREEDY = SamplingParams(temperature=0, max_tokens=6)
REPO = Path(__file__).resolve().parents[3]


def saved_chat(engine, storage, params=GREEDY) -> ChatSession:
    session = ChatSession(engine, None, params, SavedConversation.new(storage, engine, None, params))
    list(session.send("first"))
    return session


def reopened(engine, storage, conversation_id, params=GREEDY) -> ChatSession:
    return ChatSession(engine, None, params, SavedConversation.open(storage, conversation_id))


def test_a_second_session_cannot_send_while_the_first_ones_reply_streams(tiny_engine, storage):
    first = saved_chat(tiny_engine, storage)
    second = reopened(tiny_engine, storage, first.saved.id)
    streaming = first.send("go on")
    next(iter(streaming))  # the reply is under way: its turn is held
    with pytest.raises(ConversationBusy, match="answering a message in another kvchat"):
        second.send("me too")
    list(streaming)
    # The turn is over, but the second session's view is stale now: sending would fork the conversation.
    with pytest.raises(ConversationChanged, match="got new messages from another kvchat"):
        second.send("me too")
    branch = storage.conversations.branch(first.saved.id)
    assert [m.role for m in branch] == ["user", "assistant", "user", "assistant"]
    assert len(storage.conversations.all_messages(first.saved.id)) == 4  # nothing forked on a hidden branch
    list(reopened(tiny_engine, storage, first.saved.id).send("me too"))  # read afresh, it goes on
    assert len(storage.conversations.branch(first.saved.id)) == 6


def test_a_refused_turn_is_given_back(tiny_engine, storage):
    session = saved_chat(tiny_engine, storage)
    with pytest.raises(Exception, match="context window"):
        session.send("x" * 1000)  # more tokens than the window: refused before anything is stored
    list(reopened(tiny_engine, storage, session.saved.id).send("next"))  # the turn was released


@pytest.mark.slow  # two `kvchat ask` processes
def test_two_asks_on_one_conversation_at_once_take_turns(endless_model_dir):
    first = kvchat("ask", "hello", "--model", str(endless_model_dir), "--temperature", "0", "--max-tokens", "3",
                   "--json")
    conversation = json.loads(first.stdout)["conversation_id"]
    asks = [subprocess.Popen([sys.executable, "-m", "app.cli", "ask", f"question {i}", "--conversation", conversation,
                              "--model", str(endless_model_dir), "--temperature", "0", "--max-tokens", "300",
                              "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]
    results = [ask.communicate(timeout=300) for ask in asks]
    assert [ask.returncode for ask in asks] == [0, 0], [err for _, err in results]
    exported = json.loads(kvchat("export", conversation, "--format", "json").stdout)
    messages = {m["id"]: m for m in exported["messages"]}
    # One branch, alternating: the second ask waited, then answered after the first one's reply.
    assert len(messages) == 6 and exported["active_branch"] == [m["id"] for m in exported["messages"]]
    assert [messages[i]["role"] for i in exported["active_branch"]] == ["user", "assistant"] * 3
    # The later turn's prompt held the earlier turn, so its stored K/V cover the whole conversation.
    second = max((json.loads(out) for out, _ in results), key=lambda r: r["prompt_tokens"])
    assert second["cached_tokens"] > 0


def test_a_conversation_deleted_while_its_reply_streams_leaves_nothing_behind(tiny_engine, storage, kvchat_home,
                                                                              monkeypatch):
    monkeypatch.setattr(reply_writer, "PARTIAL_SAVE_S", 0.0)
    session = saved_chat(tiny_engine, storage)
    session.params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    storage.writer.flush()
    conversation = session.saved.id
    other = Storage.open()  # another kvchat, deleting it from the library
    tokens = 0
    with pytest.raises(ConversationDeleted, match="deleted while its reply was being written"):
        for event in session.send("go on"):
            if isinstance(event, TokenDelta):
                tokens += 1
                if tokens == 5:
                    from app.chat.saved.library import delete_conversation
                    delete_conversation(other.conversations, other.home, conversation, permanently=True)
            assert not isinstance(event, Done)
    other.close()
    storage.writer.flush()
    assert tokens < 20  # the reply stopped at the next save, not at its end
    assert not storage.conversations.exists(conversation)
    assert block_files(kvchat_home) == {} and storage.kv.stats().blocks == 0  # no K/V of the deleted text
    assert storage.conversations.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_the_kv_of_a_conversation_deleted_before_it_is_written_is_not_kept(tiny_engine, storage, kvchat_home):
    session = saved_chat(tiny_engine, storage)
    storage.writer.flush()
    gate = threading.Event()
    original = storage.kv.save

    def slow_save(*args, **kwargs):  # the writer is busy while the conversation is deleted
        gate.wait(10)
        return original(*args, **kwargs)

    storage.kv.save = slow_save
    list(session.send("again"))
    from app.chat.saved.library import delete_conversation
    delete_conversation(storage.conversations, storage.home, session.saved.id, permanently=True)
    gate.set()
    storage.writer.flush()
    assert block_files(kvchat_home) == {} and storage.kv.stats().blocks == 0


def test_a_conversation_moved_to_the_trash_mid_reply_takes_nothing_more(tiny_engine, storage, kvchat_home,
                                                                      monkeypatch):
    monkeypatch.setattr(reply_writer, "PARTIAL_SAVE_S", 0.0)
    session = saved_chat(tiny_engine, storage)
    session.params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    storage.writer.flush()
    before = conversation_kv(kvchat_home, session.saved.id)
    assert before[0] > 0
    files = {path: path.read_bytes() for path in before[1]}
    stored = block_files(kvchat_home)
    other, tokens, kept = Storage.open(), 0, None
    with pytest.raises(ConversationDeleted):
        for event in session.send("go on"):
            if isinstance(event, TokenDelta):
                tokens += 1
                if tokens == 5:
                    from app.chat.saved.library import delete_conversation
                    delete_conversation(other.conversations, other.home, session.saved.id)
                    kept = len(other.conversations.trashed())
    other.close()
    storage.writer.flush()
    assert kept == 1 and tokens < 20
    # The trash keeps the K/V it had, and no newer ones.
    assert conversation_kv(kvchat_home, session.saved.id) == before and block_files(kvchat_home) == stored
    assert all(path.read_bytes() == data for path, data in files.items())
    restored = storage.conversations.restore(session.saved.id)
    reply = storage.conversations.branch(restored.id)[-1]
    assert reply.role == "assistant" and len(reply.token_ids) <= 6  # what was saved before the delete, no more
