"""Regenerate N with a remote server: the alternatives are asked for one after another."""

from app.chat.backend_loader import chat_session
from app.chat.saved.conversation import SavedConversation
from engine import Done, SamplingParams, TokenDelta
from tests.app.tui.pilot import wait_until
from tests.app.remote.remote_fixtures import fake, remote, remote_app  # noqa: F401 (fixtures)
from tests.app.tui.tui_harness import exchange, ready

GREEDY_SEEDED = SamplingParams(temperature=0, max_tokens=20, seed=7)


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


async def test_the_chat_app_says_a_server_writes_them_one_after_another(fake, storage):
    remotes = []
    app = remote_app(fake.url, "sk-fake", remotes, storage)
    try:
        async with app.run_test() as pilot:
            await ready(pilot)
            await exchange(pilot, "Hi")
            old = app.session.messages[-1]
            await pilot.press("f3")
            await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].id != old.id)
            assert any("one after another" in notice for notice in app.notices)
            assert len(storage.conversations.sibling_ids(old.id)) == 1 + app.alternatives
    finally:
        for engine in remotes:
            engine.close()
