"""ConversationStore.recent_prompts: the user's latest messages, the chat input's history."""

import pytest

from storage.db.conversations import ConversationStore


@pytest.fixture
def store(kvchat_home):
    with ConversationStore.open() as store:
        yield store


def say(store, conversation_id, parent_id, role, text, created_at):
    """Add a message sent at `created_at` (epoch seconds); returns its id."""
    message_id = store.add_message(conversation_id, parent_id, role, text, 0, [1]).id
    store.db.execute("UPDATE messages SET created_at = ? WHERE id = ?", [created_at, message_id])
    return message_id


def test_an_empty_store_has_no_prompts(store):
    assert store.recent_prompts() == []


def test_user_messages_of_all_conversations_come_oldest_first_without_replies(store):
    first, second = store.create("m").id, store.create("m").id
    question = say(store, first, None, "user", "first question", 10)
    answer = say(store, first, question, "assistant", "an answer", 11)
    say(store, second, None, "user", "second chat", 12)
    say(store, first, answer, "user", "follow-up", 13)
    assert store.recent_prompts() == ["first question", "second chat", "follow-up"]


def test_the_order_is_when_they_were_sent_not_when_they_were_stored(store):
    conversation = store.create("m").id
    say(store, conversation, None, "user", "stored first, sent later", 20)
    say(store, conversation, None, "user", "stored later, sent first", 10)
    assert store.recent_prompts() == ["stored later, sent first", "stored first, sent later"]


def test_the_limit_keeps_the_most_recent(store):
    conversation = store.create("m").id
    for i in range(5):
        say(store, conversation, None, "user", f"prompt {i}", i)
    assert store.recent_prompts(limit=2) == ["prompt 3", "prompt 4"]


def test_a_text_sent_twice_in_a_row_is_kept_once(store):
    first, second = store.create("m").id, store.create("m").id
    say(store, first, None, "user", "again", 1)
    say(store, second, None, "user", "again", 2)
    say(store, first, None, "user", "other", 3)
    say(store, second, None, "user", "again", 4)
    assert store.recent_prompts() == ["again", "other", "again"]
