"""Regenerate, edit-and-resend and switching branches in the chat app, on the tiny engine."""

import pytest

from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import AssistantMessageView, UserMessageView
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, navigate_to, ready
from engine.bench.fresh import with_fresh_cache


def texts(app) -> list[str]:
    return [view.text for view in app.query_one(ChatView).views()]


async def test_regenerate_makes_a_sibling_reply_from_the_cached_prompt(tiny_engine):
    app = app_with(with_fresh_cache(tiny_engine), overrides={"max_tokens": 6, "temperature": 1.0, "seed": None})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "hello there")
        first = app.session.messages[-1]
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.generating and app.session.messages[-1].id not in (None, first.id))
        second = app.session.messages[-1]
        store = app.storage.conversations
        assert store.sibling_ids(second.id) == [first.id, second.id]
        # The prompt was computed for the first reply; the regenerated one reuses all of it but its last token.
        assert second.stats["cached_tokens"] == second.stats["prompt_tokens"] - 1
        reply_views = app.query(AssistantMessageView)
        assert len(reply_views) == 1 and "‹ 2/2 ›" in reply_views.last().header_text()
        assert len(app.query(UserMessageView)) == 1


async def test_regenerate_with_nothing_to_regenerate_says_so(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+r")
        await pilot.pause(0.1)
        assert any("no reply to regenerate" in n for n in app.notices)


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_editing_a_message_makes_a_branch_and_the_old_one_stays_reachable(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 4})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "first question")
        await exchange(pilot, "second question")
        old_branch = [m.content for m in app.session.messages]

        await navigate_to(pilot, app.query(UserMessageView).first())
        await pilot.press("e")
        prompt = app.query_one("#prompt")
        assert prompt.text == "first question" and app.chat.editing == 0
        assert app.query_one("#editing").display
        prompt.text = "a better first question"
        prompt.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.generating and len(app.session.messages) == 2
                         and app.session.messages[-1].role == "assistant")
        assert app.session.messages[0].content == "a better first question"
        assert texts(app)[0] == "a better first question" and len(texts(app)) == 2
        assert app.chat.editing is None and not app.query_one("#editing").display
        edited = app.query(UserMessageView).first()
        assert "‹ 2/2 ›" in edited.header_text()

        edited.focus()
        await pilot.press("left")  # back to the original branch, down to its newest message
        await wait_until(pilot, lambda: len(app.session.messages) == 4)
        assert [m.content for m in app.session.messages] == old_branch
        assert texts(app)[:1] == ["first question"] and len(texts(app)) == 4
        assert "‹ 1/2 ›" in app.query(UserMessageView).first().header_text()

        # Continuing the restored branch reuses its cached prefix.
        await exchange(pilot, "third question")
        stats = app.session.messages[-1].stats
        assert stats["cached_tokens"] > 0 and stats["prefilled_tokens"] < stats["prompt_tokens"]


async def test_escape_cancels_an_edit_and_ctrl_g_edits_the_last_message(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "one")
        await exchange(pilot, "two")
        await pilot.press("ctrl+g")
        assert app.chat.editing == 2 and app.query_one("#prompt").text == "two"
        await pilot.press("escape")
        assert app.chat.editing is None and app.query_one("#prompt").text == ""


async def test_a_message_without_other_versions_says_so(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test() as pilot:
        await ready(pilot)
        await exchange(pilot, "only one")
        app.query(UserMessageView).first().focus()
        await pilot.press("right")
        await pilot.pause(0.1)
        assert any("no other versions" in n for n in app.notices)
