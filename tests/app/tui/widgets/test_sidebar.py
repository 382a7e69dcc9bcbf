"""The conversation sidebar on a real store, driven by Textual's Pilot."""

import time
from datetime import datetime

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Input, ListView

from app.tui.widgets.conversation_items import ConversationItem, NoticeItem, relative_time
from app.tui.widgets.sidebar import Sidebar
from storage.db.conversations import ConversationStore
from storage.errors import StorageError
from tests.app.tui.pilot import wait_until


class SidebarApp(App):
    """Only the sidebar; keeps every message it posts as (kind, conversation id)."""

    def __init__(self, store, clock=time.time):
        super().__init__()
        self.store, self.clock = store, clock
        self.posted: list[tuple[str, str | None]] = []

    def compose(self) -> ComposeResult:
        yield Sidebar(self.store, clock=self.clock)

    def on_sidebar_open(self, message: Sidebar.Open) -> None:
        self.posted.append(("open", message.conversation_id))

    def on_sidebar_rename(self, message: Sidebar.Rename) -> None:
        self.posted.append(("rename", message.conversation_id))

    def on_sidebar_delete(self, message: Sidebar.Delete) -> None:
        self.posted.append(("delete", message.conversation_id))

    def on_sidebar_new(self, message: Sidebar.New) -> None:
        self.posted.append(("new", None))


@pytest.fixture
def store(tmp_path):
    with ConversationStore.open(tmp_path) as store:
        yield store


def chat(store, title="", *texts):
    """A conversation titled `title`, with `texts` as alternating user/assistant messages."""
    conversation = store.create(model="m", title=title)
    parent = None
    for i, text in enumerate(texts):
        parent = store.add_message(conversation.id, parent, ("user", "assistant")[i % 2], text, i, [i]).id
    return store.get(conversation.id)


def shown(app):
    """(conversation id, title, time line) of each conversation in the list, top to bottom."""
    return [(item.conversation_id, str(item.query_one(".title").render()), str(item.query_one(".time").render()))
            for item in app.query(ConversationItem)]


def shown_ids(app):
    return [item.conversation_id for item in app.query_one("#conversations", ListView).children]


def notices(app):
    return [item.text for item in app.query(NoticeItem)]


async def type_filter(pilot, text):
    pilot.app.query_one("#filter", Input).focus()
    await pilot.press(*text)


# relative_time


def at(*args):
    return datetime(*args).timestamp()


@pytest.mark.parametrize("elapsed, said", [
    (0, "just now"), (-30, "just now"), (59, "just now"),
    (60, "1 min ago"), (5 * 60 + 59, "5 min ago"), (3599, "59 min ago"),
    (3600, "1 h ago"), (3 * 3600 + 10, "3 h ago"), (24 * 3600 - 1, "23 h ago"),
])
def test_relative_time_within_a_day_counts_elapsed_time(elapsed, said):
    now = at(2026, 3, 20, 12, 0)
    assert relative_time(now - elapsed, now) == said


@pytest.mark.parametrize("then, said", [
    (at(2026, 3, 19, 11, 59), "yesterday"),
    (at(2026, 3, 19, 0, 0), "yesterday"),
    (at(2026, 3, 18, 23, 59), "2 days ago"),
    (at(2026, 3, 16, 9, 0), "4 days ago"),
    (at(2026, 3, 14, 0, 1), "6 days ago"),
    (at(2026, 3, 13, 23, 0), "13 Mar 2026"),
    (at(2025, 12, 2, 8, 0), "2 Dec 2025"),
])
def test_relative_time_past_a_day_counts_calendar_days_then_gives_the_date(then, said):
    assert relative_time(then, at(2026, 3, 20, 12, 0)) == said


def test_relative_time_just_after_midnight_still_counts_hours():
    assert relative_time(at(2026, 3, 19, 23, 0), at(2026, 3, 20, 0, 30)) == "1 h ago"


# Listing


async def test_conversations_are_listed_newest_first_with_title_and_time(store):
    old = chat(store, "Herons in winter")
    untitled = chat(store)
    newest = chat(store, "", "how do kestrels hover")
    now = newest.updated_at + 5 * 60
    app = SidebarApp(store, clock=lambda: now)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown(app)) == 3)
        assert shown(app) == [
            (newest.id, "how do kestrels hover", "5 min ago"),
            (untitled.id, "New chat", relative_time(untitled.updated_at, now)),
            (old.id, "Herons in winter", relative_time(old.updated_at, now)),
        ]
        assert app.query_one(Sidebar).selected_id == newest.id


async def test_an_empty_store_says_so(store):
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: notices(app))
        assert notices(app) == ["No conversations yet."]
        assert app.query_one(Sidebar).selected_id is None


async def test_a_title_with_markup_characters_is_shown_as_typed(store):
    chat(store, "[bold]not bold[/] [link")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: shown(app))
        assert shown(app)[0][1] == "[bold]not bold[/] [link"


async def test_listing_never_reads_messages_even_with_a_long_conversation(store, monkeypatch):
    long = chat(store, "Long one", *(f"message number {i}" for i in range(500)))
    assert len(store.all_messages(long.id)) == 500

    def forbidden(*args, **kwargs):
        raise AssertionError("the sidebar must not load messages")

    for name in ("branch", "all_messages", "message", "children", "siblings", "sibling_ids"):
        monkeypatch.setattr(store, name, forbidden)
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: shown_ids(app) == [long.id])
        chat(store, "Another")  # bypasses nothing: create and get are allowed
        await app.query_one(Sidebar).refresh_list()
        assert len(shown_ids(app)) == 2


async def test_refresh_list_keeps_the_cursor_on_the_same_conversation(store):
    first, second, third = chat(store, "one"), chat(store, "two"), chat(store, "three")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: shown_ids(app) == [third.id, second.id, first.id])
        app.query_one("#conversations", ListView).focus()
        await pilot.press("down")
        assert sidebar.selected_id == second.id
        fourth = chat(store, "four")
        await sidebar.refresh_list()
        assert shown_ids(app) == [fourth.id, third.id, second.id, first.id]
        assert sidebar.selected_id == second.id


async def test_after_the_conversation_under_the_cursor_is_deleted_the_cursor_goes_to_the_open_one(store):
    first, second, third = chat(store, "one"), chat(store, "two"), chat(store, "three")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: shown_ids(app) == [third.id, second.id, first.id])
        sidebar.highlight(first.id)
        app.query_one("#conversations", ListView).index = 1
        assert sidebar.selected_id == second.id
        store.delete(second.id)  # as the app does on Sidebar.Delete
        await sidebar.refresh_list()
        assert shown_ids(app) == [third.id, first.id]
        assert sidebar.selected_id == first.id


async def test_highlight_marks_the_open_conversation_and_moves_the_cursor_to_it(store):
    first, second = chat(store, "one"), chat(store, "two")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: shown_ids(app) == [second.id, first.id])
        sidebar.highlight(first.id)
        assert sidebar.selected_id == first.id
        assert [item.has_class("-open") for item in app.query(ConversationItem)] == [False, True]
        await sidebar.refresh_list()  # the mark survives a rebuild
        assert [item.has_class("-open") for item in app.query(ConversationItem)] == [False, True]
        sidebar.highlight(None)
        assert not any(item.has_class("-open") for item in app.query(ConversationItem))


# Filtering


async def test_the_filter_matches_titles_ignoring_case_and_clearing_it_shows_all(store):
    herons = chat(store, "Herons in winter")
    kestrels = chat(store, "Kestrels")
    more_herons = chat(store, "Grey HERONS")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 3)
        await type_filter(pilot, "heron")
        await wait_until(pilot, lambda: shown_ids(app) == [more_herons.id, herons.id])
        app.query_one("#filter", Input).value = ""
        await wait_until(pilot, lambda: shown_ids(app) == [more_herons.id, kestrels.id, herons.id])


@pytest.mark.slow  # over 2 s in the fast tier (make check)
async def test_the_filter_finds_message_text_too_and_lists_each_conversation_once(store):
    by_text = chat(store, "Birds", "where do swifts sleep", "swifts sleep while flying")  # two matching messages
    by_title = chat(store, "Swifts sleep")
    both = chat(store, "", "do swifts sleep at all")  # titled by its first message, which matches too
    chat(store, "Unrelated", "how do owls hunt")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 4)
        await type_filter(pilot, "Swifts Sleep")
        await wait_until(pilot, lambda: shown_ids(app) == [both.id, by_title.id, by_text.id])
        # Messages need every word in any order; a title needs the whole text.
        app.query_one("#filter", Input).value = "sleep swifts"
        await wait_until(pilot, lambda: shown_ids(app) == [both.id, by_text.id])
        await pilot.press(*" owls")
        await wait_until(pilot, lambda: notices(app) == ["No conversation matches."])


async def test_search_reaches_conversations_older_than_the_loaded_rows(store, monkeypatch):
    old = chat(store, "Old", "the word albatross")
    newer = [chat(store, f"newer {i}") for i in range(3)]
    monkeypatch.setattr("app.tui.widgets.sidebar.MAX_ROWS", 2)
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: shown_ids(app) == [newer[2].id, newer[1].id])
        await type_filter(pilot, "albatross")
        await wait_until(pilot, lambda: shown_ids(app) == [old.id])


async def test_typing_is_debounced_into_few_queries(store, monkeypatch):
    chat(store, "Herons")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 1)
        queries = []
        search = store.search
        monkeypatch.setattr(store, "search", lambda text, **kw: queries.append(text) or search(text, **kw))
        await type_filter(pilot, "herons")
        await wait_until(pilot, lambda: queries and queries[-1] == "herons")
        await pilot.pause(0.3)
        assert len(queries) < 3 and queries[-1] == "herons"


async def test_a_failing_search_shows_one_line_instead_of_crashing(store, monkeypatch):
    chat(store, "Herons")

    def broken(*args, **kwargs):
        raise StorageError("The disk could not be read or written (disk I/O error): "
                           "the conversations could not be read.")

    monkeypatch.setattr(store, "search", broken)
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 1)
        await type_filter(pilot, "heron")
        await wait_until(pilot, lambda: notices(app))
        assert notices(app) == ["Search failed: The disk could not be read or written (disk I/O error): "
                                "the conversations could not be read."]
        assert app.query_one(Sidebar).selected_id is None
        app.query_one("#conversations", ListView).focus()
        await pilot.press("enter", "r", "d")
        assert app.posted == []


async def test_a_failing_list_shows_one_line_instead_of_crashing(store, monkeypatch):
    def broken(*args, **kwargs):
        raise StorageError("The conversation database is damaged: the conversations could not be read.")

    monkeypatch.setattr(store, "list", broken)
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: notices(app))
        assert notices(app) == ["Conversations could not be listed: The conversation database is damaged: "
                                "the conversations could not be read."]


# Keys and selection


async def test_enter_opens_the_conversation_under_the_cursor(store):
    first, second = chat(store, "one"), chat(store, "two")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 2)
        app.query_one("#conversations", ListView).focus()
        await pilot.press("enter", "down", "enter")
        await wait_until(pilot, lambda: len(app.posted) == 2)
        assert app.posted == [("open", second.id), ("open", first.id)]


async def test_a_click_opens_the_conversation(store):
    first, second = chat(store, "one"), chat(store, "two")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: shown_ids(app) == [second.id, first.id])
        older = app.query(ConversationItem)[1]
        await wait_until(pilot, lambda: older.region)  # laid out, so there is somewhere to click
        await pilot.click(older)
        await wait_until(pilot, lambda: app.posted)
        assert app.posted == [("open", first.id)]


async def test_enter_in_the_filter_moves_to_the_list_and_enter_there_opens(store):
    herons = chat(store, "Herons")
    chat(store, "Kestrels")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 2)
        await type_filter(pilot, "heron")
        await pilot.press("enter")
        assert app.query_one("#conversations", ListView).has_focus
        assert shown_ids(app) == [herons.id]
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.posted)
        assert app.posted == [("open", herons.id)]


async def test_r_d_delete_and_n_post_their_messages_for_the_conversation_under_the_cursor(store):
    first, second = chat(store, "one"), chat(store, "two")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 2)
        app.query_one("#conversations", ListView).focus()
        await pilot.press("r", "down", "d", "delete", "n")
        await wait_until(pilot, lambda: len(app.posted) == 4)
        assert app.posted == [("rename", second.id), ("delete", first.id), ("delete", first.id), ("new", None)]
        assert store.get(first.id).title == "one"  # the sidebar itself changes nothing


async def test_letters_typed_in_the_filter_are_text_not_commands(store):
    chat(store, "Random notes")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 1)
        await type_filter(pilot, "rnd")
        await pilot.press("delete")
        assert app.query_one("#filter", Input).value == "rnd"
        assert app.posted == []


async def test_the_footer_offers_rename_and_delete_only_on_the_list(store):
    chat(store, "one")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        sidebar = app.query_one(Sidebar)
        await wait_until(pilot, lambda: len(shown_ids(app)) == 1)
        app.query_one("#conversations", ListView).focus()
        await pilot.pause()
        assert sidebar.check_action("rename", ()) and sidebar.check_action("new", ())
        app.query_one("#filter", Input).focus()
        await pilot.pause()
        assert not sidebar.check_action("rename", ()) and not sidebar.check_action("delete", ())


async def test_down_in_the_filter_moves_to_the_list_and_slash_back(store):
    chat(store, "one")
    app = SidebarApp(store)
    async with app.run_test() as pilot:
        await wait_until(pilot, lambda: len(shown_ids(app)) == 1)
        await type_filter(pilot, "on")
        await pilot.press("down")
        assert app.query_one("#conversations", ListView).has_focus
        await pilot.press("slash", "e")
        assert app.query_one("#filter", Input).value == "one"


async def test_highlighting_while_the_app_closes_and_the_list_is_gone_raises_nothing(store):
    # The first message's save may reach the sidebar after Textual began removing its children (the user
    # quit at once): the full suite once ended a chat with NoMatches on #conversations there.
    opened = chat(store, "Herons")
    app = SidebarApp(store)
    async with app.run_test():
        sidebar = app.query_one(Sidebar)
        await sidebar.remove_children()
        sidebar.highlight(opened.id)
        assert sidebar.open_id == opened.id
