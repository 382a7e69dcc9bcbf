"""Where keys go in the chat app: typing reaches the message box wherever the focus happens to be,
single-letter keys act only where the user navigated with the arrow keys, Esc comes back to the box."""

import pytest

from app.tui.screens.confirm import ConfirmScreen
from app.tui.screens.text_prompt import TextPromptScreen
from app.tui.widgets.messages import AssistantMessageView, UserMessageView
from app.tui.widgets.status_bar import StatusBar
from tests.app.tui.pilot import wait_until
from tests.app.tui.tui_harness import app_with, exchange, ready, send, slow_and_endless


def prompt_text(app) -> str:
    return app.query_one("#prompt").text


async def saved_chat(pilot) -> str:
    await ready(pilot)
    await exchange(pilot, "about herons")
    return pilot.app.conversation_id


async def test_letters_typed_after_ctrl_b_twice_go_to_the_message_box(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        conversation_id = await saved_chat(pilot)
        await pilot.press("ctrl+b", "ctrl+b")
        assert app.focused.id == "conversations"
        await pilot.press(*"rename dn")
        assert prompt_text(app) == "rename dn"
        assert app.focused.id == "prompt"
        assert not isinstance(app.screen, (TextPromptScreen, ConfirmScreen))
        assert app.storage.conversations.get(conversation_id).title == "about herons"


async def test_letters_typed_on_a_focused_message_go_to_the_message_box(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        app.query_one(UserMessageView).focus()  # as a click or Tab leaves it
        await pilot.pause()
        await pilot.press(*"ed<r")
        assert prompt_text(app) == "ed<r"
        assert app.chat.editing is None and not app.generating and len(app.session.messages) == 2
        app.query_one(AssistantMessageView).focus()
        await pilot.pause()
        await pilot.press("r", "c")
        assert prompt_text(app) == "ed<rrc"
        assert not app.generating and len(app.session.messages) == 2


async def test_after_an_arrow_key_a_messages_letters_act(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        app.query_one(AssistantMessageView).focus()
        await pilot.pause()
        await pilot.press("up")  # navigating: to the user's message, whose letters act now
        assert isinstance(app.focused, UserMessageView)
        await pilot.press("e")
        assert app.chat.editing == 0 and prompt_text(app) == "about herons"


async def test_ctrl_up_goes_to_the_last_message_with_its_letters_acting(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        await pilot.press("ctrl+up")
        await wait_until(pilot, lambda: isinstance(app.focused, AssistantMessageView))
        await pilot.press("c")
        assert app.clipboard == app.query_one(AssistantMessageView).text
        assert prompt_text(app) == ""


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_after_an_arrow_key_the_lists_letters_act_and_leaving_it_ends_that(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        await pilot.press("ctrl+b", "ctrl+b", "down", "r")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPromptScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, TextPromptScreen))
        await pilot.press("escape")  # back in the box; Ctrl+B again lands on the list without navigating
        await pilot.press("ctrl+b", "ctrl+b", "r")
        assert prompt_text(app) == "r" and not isinstance(app.screen, TextPromptScreen)


async def test_d_then_enter_in_the_list_does_not_delete_the_chat(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        conversation_id = await saved_chat(pilot)
        await pilot.press("ctrl+b", "ctrl+b", "up", "d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert app.storage.conversations.get(conversation_id).id == conversation_id


async def test_the_footer_dims_the_lists_letters_until_the_user_navigates(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        await pilot.press("ctrl+b", "ctrl+b")
        sidebar = app.query_one("#sidebar")
        assert sidebar.check_action("rename", ()) is None
        await pilot.press("down")
        assert sidebar.check_action("rename", ()) is True


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_escape_brings_the_focus_back_to_the_message_box_from_anywhere(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        await saved_chat(pilot)
        for keys in (["ctrl+b", "ctrl+b"], ["ctrl+up"], ["ctrl+f"]):
            await pilot.press(*keys)
            await wait_until(pilot, lambda: app.focused is not None and app.focused.id != "prompt")
            await pilot.press("escape")
            await wait_until(pilot, lambda: app.focused.id == "prompt")


async def test_escape_on_a_message_stops_the_reply_and_returns_to_the_box(tiny_engine, monkeypatch):
    slow_and_endless(tiny_engine, monkeypatch)
    app = app_with(tiny_engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "tell me everything")
        await wait_until(pilot, lambda: app.query_one(StatusBar).phase == "decode")
        app.query_one(UserMessageView).focus()
        await wait_until(pilot, lambda: isinstance(app.focused, UserMessageView))
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating)
        assert app.session.messages[-1].status == "stopped"
        assert app.focused.id == "prompt"
