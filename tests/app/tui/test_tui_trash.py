"""The trash in the chat: Ctrl+Z while the "moved to the trash" notice is up brings the conversation
back; the palette's "Show the trash" lists it in the sidebar, where Enter restores one; and the list
follows deletions and restores made by another process (the CLI) while the window is open."""

import pytest

from app.chat.saved.conversation import Storage
from app.tui.screens.confirm import ConfirmScreen
from app.tui.widgets.sidebar import Sidebar
from storage.errors import StorageError
from tests.app.tui.pilot import wait_until
from tests.app.tui.test_tui_library import listed, two_conversations
from tests.app.tui.tui_harness import app_with


async def delete_in_the_app(pilot, conversation_id: str) -> None:
    app = pilot.app
    app.query_one(Sidebar).post_message(Sidebar.Delete(conversation_id))
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    await pilot.press("y")
    await wait_until(pilot, lambda: conversation_id not in listed(app))


async def test_ctrl_z_while_the_trash_notice_is_up_restores_the_conversation(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await delete_in_the_app(pilot, second)
        assert any("Ctrl+Z undoes it" in notice for notice in app.notices)
        app.query_one("#prompt").focus()
        await pilot.press("ctrl+z")
        await wait_until(pilot, lambda: listed(app) == [second, first] and app.conversation_id == second)
        assert app.storage.conversations.get(second).deleted_at is None
        assert any(notice.startswith("Restored “") for notice in app.notices)


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_ctrl_z_with_no_trash_notice_up_is_the_message_boxs_undo(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await delete_in_the_app(pilot, second)
        await pilot.press("ctrl+z")  # the conversation comes back
        await wait_until(pilot, lambda: second in listed(app))
        app.query_one("#prompt").focus()
        await pilot.press(*"hello")
        await pilot.press("ctrl+z")  # now the box's own undo
        await wait_until(pilot, lambda: app.query_one("#prompt").text == "")
        assert listed(app) == [second, first]


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_ctrl_z_after_typing_since_the_trash_notice_undoes_the_typing_not_the_delete(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await delete_in_the_app(pilot, second)
        app.query_one("#prompt").focus()
        await pilot.press(*"hello")
        await wait_until(pilot, lambda: app.query_one("#prompt").text == "hello")
        await pilot.press("ctrl+z")  # the notice is still up, but the typing is what the user undoes
        await wait_until(pilot, lambda: app.query_one("#prompt").text == "")
        assert listed(app) == [first]
        with pytest.raises(StorageError, match="is in the trash"):
            app.storage.conversations.get(second)


async def test_show_the_trash_lists_it_and_enter_restores_one(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        app.storage.conversations.trash(first)
        [show_trash] = [c for c in app.get_system_commands(app.screen) if c.title == "Show the trash"]
        await show_trash.callback()
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: sidebar.showing_trash and listed(app) == [first])
        await wait_until(pilot, lambda: app.focused is sidebar.query_one("#conversations"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: not sidebar.showing_trash and listed(app) == [second, first])
        await wait_until(pilot, lambda: app.conversation_id == first)
        assert app.storage.conversations.get(first).deleted_at is None


async def test_t_in_the_list_switches_between_the_saved_conversations_and_the_trash(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        app.storage.conversations.trash(first)
        sidebar = app.query_one(Sidebar)
        await sidebar.refresh_list()
        sidebar.query_one("#conversations").focus()
        await pilot.press("down", "t")  # an arrow key first: then the list's letters act
        await wait_until(pilot, lambda: sidebar.showing_trash and listed(app) == [first])
        await pilot.press("t")
        await wait_until(pilot, lambda: not sidebar.showing_trash and listed(app) == [second])


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_list_follows_a_delete_and_a_restore_made_by_another_process(tiny_engine):
    app = app_with(tiny_engine, overrides={"max_tokens": 3})
    async with app.run_test(size=(120, 40)) as pilot:
        first, second = await two_conversations(pilot)
        await pilot.press("ctrl+n")
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: listed(app) == [second, first])
        assert not await sidebar.check_for_changes()  # nothing changed: nothing read again
        other = Storage.open()  # the CLI: another connection to the same database
        try:
            other.conversations.trash(first)
            assert await sidebar.check_for_changes()
            await wait_until(pilot, lambda: listed(app) == [second])
            other.conversations.restore(first)
            await wait_until(pilot, lambda: listed(app) == [second, first])  # the timer's check, this time
        finally:
            other.close()
