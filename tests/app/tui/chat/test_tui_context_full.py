"""The chat app when the next message no longer fits the context window: the meter warns, one notice offers
two ways on (d, c), each makes a new branch and says what it cost; /drop-oldest and /compact do the same."""

import threading

import pytest

from app.tui.chat import overflow as context_actions
from app.chat.context.compaction import CompactionStopped, compact
from app.chat.saved.conversation import Storage
from app.tui.screens.context_full import ContextFullScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.status_bar import StatusBar
from app.tui.widgets.summary_view import SummaryMessageView
from tests.app.context_fixtures import small_engine, NEXT, TURNS, long_conversation, rows
from app.tui.widgets.prompt_input import PromptInput
from tests.app.tui.pilot import type_ahead, wait_until
from tests.app.tui.tui_harness import app_with, ready, send


@pytest.fixture
def full_app(small_engine):
    """(the app on a conversation the next message does not fit, its id, its rows before)."""
    storage = Storage.open()
    session = long_conversation(small_engine, storage)
    conversation = session.saved.id
    return app_with(small_engine, storage, conversation_id=conversation, overrides={"max_tokens": 8}), \
        conversation, rows(storage, conversation)


def untouched(app, conversation, before) -> bool:
    after = rows(app.storage, conversation)
    return {k: v for k, v in after.items() if k in before} == before


async def refused(pilot):
    """Send the message that does not fit; the notice shows, and nothing was sent."""
    app = pilot.app
    await ready(pilot)
    bar = app.query_one(StatusBar)
    assert bar.context_warns() and "ctx 4" in bar.status_text()  # about 430 of 512 tokens: over 80%
    await send(pilot, NEXT)
    await wait_until(pilot, lambda: isinstance(app.screen, ContextFullScreen))
    assert "drop the oldest turns or compact them" in app.screen.notice
    assert len(app.session.messages) == 8 and app.query_one("#prompt").text == NEXT


async def test_d_drops_the_oldest_turns_on_a_new_branch_and_says_what_it_cost(full_app):
    app, conversation, before = full_app
    async with app.run_test(size=(160, 40)) as pilot:
        await refused(pilot)
        await pilot.press("d")
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].role == "assistant"
                         and any(n.startswith("Left out the oldest") for n in app.notices))
        assert [m.content for m in app.session.messages if m.role == "user"] == [*TURNS[1:4], NEXT]
        assert [v.text for v in app.query_one(ChatView).views()][0] == TURNS[1]
        assert app.query_one("#prompt").text == ""
        report = next(n for n in app.notices if n.startswith("Left out the oldest 2 messages"))
        stats = app.session.messages[-1].stats
        assert f"{stats['prefilled_tokens']} tokens to compute, {stats['cached_tokens']} came from the cache" in report
        assert stats["cached_tokens"] > 0
        assert untouched(app, conversation, before)


async def test_c_compacts_into_a_summary_on_a_new_branch(full_app):
    app, conversation, before = full_app
    async with app.run_test(size=(160, 40)) as pilot:
        await refused(pilot)
        await pilot.press("c")
        await wait_until(pilot, lambda: not app.generating and len(app.session.messages) == 3
                         and app.session.messages[-1].role == "assistant"
                         and any(n.startswith("Compacted 8 messages") for n in app.notices))
        assert [m.role for m in app.session.messages] == ["system", "user", "assistant"]
        views = list(app.query_one(ChatView).views())
        assert isinstance(views[0], SummaryMessageView) and views[1].text == NEXT
        assert untouched(app, conversation, before)


async def test_escape_leaves_the_message_in_the_box_and_the_conversation_as_it_was(full_app):
    app, conversation, before = full_app
    async with app.run_test(size=(160, 40)) as pilot:
        await refused(pilot)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ContextFullScreen))
        assert app.query_one("#prompt").text == NEXT and rows(app.storage, conversation) == before


async def test_stopping_the_summary_changes_nothing(full_app, monkeypatch):
    app, conversation, before = full_app

    def stopped(session, text, before_messages, on_pass):  # as if Esc stopped the summary at its first token
        raise CompactionStopped()
    monkeypatch.setattr(context_actions, "compact", stopped)
    async with app.run_test(size=(160, 40)) as pilot:
        await refused(pilot)
        await pilot.press("c")
        await wait_until(pilot, lambda: any("Compacting was stopped" in n for n in app.notices))
        assert not app.generating and app.query_one(StatusBar).phase == "idle"
        assert app.query_one("#prompt").text == NEXT and rows(app.storage, conversation) == before


async def test_the_slash_commands_take_the_same_ways(full_app):
    app, conversation, before = full_app
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/drop-oldest")
        await wait_until(pilot, lambda: any("/drop-oldest needs the message" in n for n in app.notices))
        await send(pilot, f"/drop-oldest {NEXT}")
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].role == "assistant"
                         and any(n.startswith("Left out the oldest") for n in app.notices))
        assert app.session.messages[-2].content == NEXT and app.query_one("#prompt").text == ""
        await send(pilot, "/compact and what now?")
        await wait_until(pilot, lambda: not app.generating and len(app.session.messages) == 3
                         and app.session.messages[-1].role == "assistant")
        assert [m.role for m in app.session.messages] == ["system", "user", "assistant"]
        assert app.session.messages[1].content == "and what now?" and app.query_one("#prompt").text == ""
        assert untouched(app, conversation, before)


async def test_slash_compact_leaves_the_box_at_once_shows_its_pass_and_refuses_a_second_one(full_app, monkeypatch):
    app, conversation, before = full_app
    passes, release = [], threading.Event()

    def held(session, text, before_messages, on_pass):  # each pass waits for the test, as a slow model would
        def began(number):
            passes.append(number)
            on_pass(number)
            release.wait(30)
        return compact(session, text, before_messages, began)
    monkeypatch.setattr(context_actions, "compact", held)
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        prompt, bar = app.query_one(PromptInput), app.query_one(StatusBar)
        await type_ahead(pilot, "/compact and what now?", "enter", "/compact and what now?", "enter")
        await wait_until(pilot, lambda: bar.status_text().startswith("compacting: 8 messages, pass 1"))
        await wait_until(pilot, lambda: any("being compacted" in n for n in app.notices))
        assert prompt.text == "/compact and what now?"  # the second, refused, is back in the box, alone
        prompt.clear()
        await type_ahead(pilot, "Hi", "enter")  # a message meanwhile waits for the new branch's reply
        await wait_until(pilot, lambda: prompt.queued == "Hi")
        release.set()
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].role == "assistant"
                         and len(app.session.messages) == 5)
        # One compaction (a second would count its passes from 1 again), then the queued message.
        assert passes == list(range(1, len(passes) + 1))
        assert [m.content for m in app.session.messages if m.role == "user"] == ["and what now?", "Hi"]


async def test_escape_before_a_pass_begins_stops_the_compacting_and_gives_the_command_back(full_app, monkeypatch):
    app, conversation, before = full_app
    release = threading.Event()

    def held(session, text, before_messages, on_pass):  # Esc comes while the first pass is about to begin
        return compact(session, text, before_messages, lambda number: (release.wait(30), on_pass(number)))
    monkeypatch.setattr(context_actions, "compact", held)
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await type_ahead(pilot, "/compact and what now?", "enter")
        await wait_until(pilot, lambda: app.chat.compacting)
        await pilot.press("escape")
        release.set()
        await wait_until(pilot, lambda: any("Compacting was stopped" in n for n in app.notices))
        assert not app.generating and app.query_one("#prompt").text == "/compact and what now?"
        assert rows(app.storage, conversation) == before


async def test_an_edit_that_no_longer_fits_drops_the_oldest_of_the_turns_before_it(full_app):
    app, conversation, before = full_app
    edited = "E " + "an edited last question that is much longer than it was ".ljust(198, "-")
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+g")  # edit the last message of yours
        await wait_until(pilot, lambda: app.chat.editing == 6)
        await send(pilot, edited)
        await wait_until(pilot, lambda: isinstance(app.screen, ContextFullScreen))
        await pilot.press("d")
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].role == "assistant"
                         and app.session.messages[-2].content == edited)
        # The turns before the edited message, the oldest of them left out; the last turn was what was edited.
        assert [m.content for m in app.session.messages if m.role == "user"] == [*TURNS[1:3], edited]
        assert app.chat.editing is None and untouched(app, conversation, before)


async def test_a_command_that_cannot_help_says_why_and_keeps_the_box(full_app):
    app, conversation, before = full_app
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "/drop-oldest short")
        await wait_until(pilot, lambda: any("fits with that message" in n for n in app.notices))
        await send(pilot, "/drop-oldest " + "x" * 480)
        await wait_until(pilot, lambda: any("shorten the message" in n for n in app.notices))
        assert app.query_one("#prompt").text == "/drop-oldest " + "x" * 480
        assert rows(app.storage, conversation) == before
