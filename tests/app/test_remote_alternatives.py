"""Regenerate N with a remote server: the alternatives are asked for one after another."""

import pytest

from app.chat.backend_loader import chat_session
from app.chat.saved_chat import SavedConversation, Storage
from engine import Done, SamplingParams, TokenDelta
from tests.app.test_remote import fake, remote  # noqa: F401 (fixtures)

GREEDY_SEEDED = SamplingParams(temperature=0, max_tokens=20, seed=7)


@pytest.fixture
def storage():
    storage = Storage.open()
    yield storage
    storage.close()


def answered(remote, storage):
    session = chat_session(remote, None, GREEDY_SEEDED, SavedConversation.new(storage, remote, None, GREEDY_SEEDED))
    list(session.send("Hi"))
    return session


def test_a_server_is_asked_for_each_alternative_in_turn_and_each_is_a_branch(fake, remote, storage):
    session = answered(remote, storage)
    old, asked = session.messages[-1], len(fake.requests)
    replies = session.regenerate_alternatives(3)
    order = [i for i, item in replies.events() if isinstance(item, Done)]
    assert order == [0, 1, 2]
    sent = fake.requests[asked:]
    assert [(body["seed"], body["temperature"]) for body in sent] == [(8, 0.7), (9, 0.7), (10, 0.7)]
    assert storage.conversations.sibling_ids(old.id) == [old.id, *(reply.id for reply in replies.replies)]
    assert [reply.content for reply in replies.replies] == ["Hello from the server."] * 3


def test_stopping_asks_for_no_more_alternatives(fake, remote, storage):
    fake.script.chunk_delay_s = 0.05
    session = answered(remote, storage)
    asked = len(fake.requests)
    replies = session.regenerate_alternatives(3)
    for i, item in replies.events():
        if isinstance(item, TokenDelta):
            session.cancel()
    assert len(fake.requests) == asked + 1
    first, *rest = replies.replies
    assert first.status == "stopped" and first.content and rest == [None, None]
