"""The chat on narrow terminals (the sizes a newcomer tried: 160x45, 80x30, 60x20): the conversation
list folds away below 100 columns and comes back when the terminal widens, the panels cover the chat
instead of squeezing it, and a code block too wide for the chat scrolls sideways."""

import pytest
from textual.widgets._footer import FooterKey
from textual.widgets.markdown import MarkdownFence

from app.chat.saved.conversation import Storage
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import HINT, Inspector
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.sidebar import Sidebar
from tests.app.tui.pilot import wait_until
from tests.app.tui.widgets.screen_text import screen_lines
from tests.app.tui.tui_harness import RecordingApp, app_with, ready
from engine.bench.fresh import with_fresh_cache

LONG_LINE = "result = sorted(names_from_the_database, key=lambda name: (name.lower(), len(name)), reverse=True)"


@pytest.mark.parametrize("size", [(80, 30), (60, 20)])
async def test_a_narrow_terminal_folds_the_conversation_list_away(tiny_engine, size):
    app = app_with(tiny_engine)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        assert not app.query_one(Sidebar).display
        assert app.query_one(ChatView).region.width == size[0]


async def test_a_wide_terminal_keeps_the_list_beside_the_chat(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        sidebar, chat = app.query_one(Sidebar), app.query_one(ChatView)
        assert sidebar.display and chat.region.x >= sidebar.region.right


async def test_ctrl_b_on_a_narrow_terminal_shows_the_list_over_the_chat(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: app.query_one(Sidebar).display)
        await pilot.pause()
        assert app.query_one(Sidebar).region.x == 0 and app.query_one(ChatView).region.width == 80
        assert "Search conversations" in screen_lines(app)[1]


async def test_picking_a_conversation_on_a_narrow_terminal_closes_the_list_over_the_chat(tiny_engine):
    storage = Storage.open()
    other = storage.conversations.create(model=tiny_engine.info.model_name, title="Another chat")
    storage.conversations.add_message(other.id, None, "user", "Another chat", 0, [1])
    app = app_with(tiny_engine, storage)
    async with app.run_test(size=(80, 30)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+b")
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: sidebar.display)
        sidebar.post_message(Sidebar.Open(other.id))
        await wait_until(pilot, lambda: app.conversation_id == other.id and not sidebar.display)
        assert app.focused is app.query_one("#prompt")
    storage.close()


async def test_widening_brings_the_list_back_unless_the_user_hid_it(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        sidebar = app.query_one(Sidebar)
        await pilot.resize_terminal(80, 30)
        await wait_until(pilot, lambda: not sidebar.display)
        await pilot.resize_terminal(160, 45)
        await wait_until(pilot, lambda: sidebar.display)
        await pilot.press("ctrl+b")  # hidden by the user, on a wide terminal
        await wait_until(pilot, lambda: not sidebar.display)
        await pilot.resize_terminal(80, 30)
        await pilot.pause(0.1)
        await pilot.resize_terminal(160, 45)
        await pilot.pause(0.1)
        assert not sidebar.display


@pytest.mark.parametrize("size", [(80, 30), (60, 20)])
async def test_the_inspector_on_a_narrow_terminal_covers_the_chat_and_shows_its_hint(tiny_engine, size):
    app = app_with(tiny_engine)
    async with app.run_test(size=size) as pilot:  # this crashed: the message box got 0 columns
        await ready(pilot)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: app.query_one(Inspector).display)
        await pilot.pause()
        inspector = app.query_one(Inspector)
        assert inspector.region.right == size[0] and app.query_one(ChatView).region.width == size[0]
        shown = " ".join(line[inspector.region.x + 2 :].strip() for line in screen_lines(app)[:6])
        assert HINT in " ".join(shown.split())


@pytest.fixture
def code_app(tiny_engine):
    storage = Storage.open()
    store = storage.conversations
    conversation = store.create(model=tiny_engine.info.model_name, title="Sorting")
    question = store.add_message(conversation.id, None, "user", "How do I sort?", 0, [1, 2, 3])
    store.add_message(conversation.id, question.id, "assistant", f"Like this:\n\n```python\n{LONG_LINE}\n```\n", 3,
                      [4, 5])
    yield RecordingApp(lambda spec, progress: with_fresh_cache(tiny_engine), storage,
                       conversation_id=conversation.id)
    storage.close()


async def test_a_code_block_wider_than_the_chat_scrolls_sideways(code_app):
    async with code_app.run_test(size=(80, 30)) as pilot:
        await ready(pilot)
        fence = code_app.query_one(MarkdownFence)
        assert fence.max_scroll_x > 0 and fence.scrollbar_size_horizontal == 1  # a scrollbar says there is more
        code_app.query_one(AssistantMessageView).focus()
        await pilot.press("shift+right")
        await wait_until(pilot, lambda: fence.scroll_x > 0)
        await pilot.press("shift+left")
        await wait_until(pilot, lambda: fence.scroll_x == 0)


async def test_a_code_block_that_fits_has_no_scrollbar(code_app):
    async with code_app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        fence = code_app.query_one(MarkdownFence)
        assert fence.max_scroll_x == 0 and fence.scrollbar_size_horizontal == 0


async def test_esc_closes_the_list_shown_over_the_chat_at_80x24(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        sidebar = app.query_one(Sidebar)
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: sidebar.display)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not sidebar.display)
        assert app.focused is app.query_one("#prompt")


async def test_typing_while_the_list_covers_the_chat_goes_to_its_search_not_the_hidden_box(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        sidebar = app.query_one(Sidebar)
        await pilot.press("ctrl+b")
        await wait_until(pilot, lambda: sidebar.display)
        await pilot.press(*"hello")
        await wait_until(pilot, lambda: sidebar.filter_text == "hello")
        assert app.query_one("#prompt").text == ""
        assert sidebar.display and app.focused is sidebar.query_one("#filter")


@pytest.mark.parametrize("size", [(80, 24), (60, 20), (160, 45)])
async def test_the_key_bar_shows_fewer_keys_rather_than_a_cut_one(tiny_engine, size):
    app = app_with(tiny_engine)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        # The footer recomposes its keys once the chat is mounted: wait for the palette's key to be there.
        await wait_until(pilot, lambda: any(key.has_class("-command-palette") for key in app.query(FooterKey)))
        keys = list(app.query(FooterKey))
        palette = next(key for key in keys if key.has_class("-command-palette"))
        shown = [key for key in keys if key is not palette]
        assert shown and all(key.region.right <= palette.region.x for key in shown)
        # The keys' layout is settled above; the screen may show it a refresh later (under load: seen once).
        labels = [f"{key.key_display} {key.description}" for key in shown]
        await wait_until(pilot, lambda: all(label in screen_lines(app)[-1] for label in labels), timeout=5)


async def test_the_empty_chat_names_help_and_its_commands(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        await pilot.pause()
        assert "/help or F1: all keys and commands" in str(app.query_one("#welcome").render())


async def test_narrowing_the_terminal_leaves_keys_out_of_the_key_bar_rather_than_cutting_one(tiny_engine):
    app = app_with(tiny_engine)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        wide = len(app.query(FooterKey))
        await pilot.resize_terminal(80, 24)

        def fits() -> bool:
            keys = list(app.query(FooterKey))
            # The footer recomposes its keys after a resize: mid-way, the palette's key may not be mounted yet.
            palette = next((key for key in keys if key.has_class("-command-palette")), None)
            if palette is None:
                return False
            return len(keys) < wide and all(k.region.right <= palette.region.x for k in keys if k is not palette)

        await wait_until(pilot, fits)
