"""The conversation library in the chat app: switching, searching and deleting through the sidebar."""

import pytest

from app.tui.screens.confirm import ConfirmScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.sidebar import Sidebar
from storage.errors import StorageError
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, ready


def shown(app) -> list[str]:
    return [view.text for view in app.query_one(ChatView).views()]


def listed(app) -> list[str]:
    return [item.conversation_id for item in app.query("ConversationItem")]


async def two_conversations(pilot) -> tuple[str, str]:
    app = pilot.app
    await ready(pilot)
    await exchange(pilot, "about herons")
    first = app.conversation_id
    await pilot.press("ctrl+n")
    await ready(pilot)
    await exchange(pilot, "about swifts")
    return first, app.conversation_id


async def test_switching_conversations_shows_each_ones_history_and_continues_it(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await wait_until(pilot, lambda: listed(app) == [second, first])
        app.query_one(Sidebar).post_message(Sidebar.Open(first))
        await wait_until(pilot, lambda: app.conversation_id == first and app.session is not None)
        assert shown(app)[0] == "about herons" and len(shown(app)) == 2
        await exchange(pilot, "more herons")
        assert [m.role for m in app.storage.conversations.branch(first)] == ["user", "assistant"] * 2
        assert len(app.storage.conversations.branch(second)) == 2


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_search_filters_the_list_by_message_text(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await pilot.press("ctrl+f")
        assert app.focused.id == "filter"
        await pilot.press(*"herons")
        await wait_until(pilot, lambda: listed(app) == [first])


async def test_deleting_the_open_conversation_asks_first_then_starts_a_new_chat(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        app.query_one(Sidebar).post_message(Sidebar.Delete(second))
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # not yet
        assert app.storage.conversations.get(second).id == second
        app.query_one(Sidebar).post_message(Sidebar.Delete(second))
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: listed(app) == [first])
        with pytest.raises(StorageError):
            app.storage.conversations.get(second)
        assert app.conversation_id is None and shown(app) == []
