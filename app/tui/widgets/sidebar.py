"""The conversation sidebar: saved conversations newest first, filtered as you type.

It only reads the store (the conversations table, plus full-text search while filtering), so it
stays instant however long the conversations are. Opening, renaming, deleting and starting a chat
are posted as messages; the app does them and then calls refresh_list(). The list's single-letter
keys act only when the app says so (see letter_keys.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from datetime import date

from textual import on
from textual.app import ComposeResult
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Label, ListItem, ListView

from app.tui.widgets.letter_keys import letters_act
from storage.db.conversations import Conversation, ConversationStore
from storage.errors import StorageError

MAX_ROWS = 500  # conversations loaded into the list; older ones are reached by searching
SEARCH_HITS = 200  # matching messages asked of the search (several may share a conversation)
FILTER_DELAY_S = 0.15  # typing re-queries once the keys pause this long, not on every key
TIMES_REFRESH_S = 30.0  # "just now" becomes "1 min ago" without a re-query
UNTITLED = "New chat"
# Fixed English month names: strftime's %b would follow whatever locale the process runs in.
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def relative_time(then: float, now: float) -> str:
    """When `then` was, seen from `now` (epoch seconds), as a person would say it in a list:
    "just now", "5 min ago", "3 h ago", "yesterday", "4 days ago", then the date ("12 Mar 2026").
    Hours count elapsed time; days count calendar days in local time."""
    elapsed = now - then
    if elapsed < 60:  # a clock a little behind another process's counts as now too
        return "just now"
    if elapsed < 3600:
        return f"{int(elapsed // 60)} min ago"
    if elapsed < 24 * 3600:
        return f"{int(elapsed // 3600)} h ago"
    then_day = date.fromtimestamp(then)
    # At least a day: over a day has passed, even if a daylight-saving change says otherwise.
    days = max(1, (date.fromtimestamp(now) - then_day).days)
    if days == 1:
        return "yesterday"
    if days < 7:
        return f"{days} days ago"
    return f"{then_day.day} {MONTHS[then_day.month - 1]} {then_day.year}"


def filter_conversations(conversations: Iterable[Conversation], text: str,
                         found_in: Iterable[Conversation] = ()) -> list[Conversation]:
    """The conversations whose title contains `text` (ignoring case), together with `found_in`
    (those whose messages matched the search), each once, newest activity first."""
    needle = text.strip().casefold()
    chosen = {c.id: c for c in conversations if needle in (c.title or UNTITLED).casefold()}
    chosen.update({c.id: c for c in found_in})
    return sorted(chosen.values(), key=lambda c: (-c.updated_at, c.id))


class ConversationItem(ListItem):
    """One conversation: its title on one line (cut to fit), when it was last active below."""

    def __init__(self, conversation: Conversation, now: float):
        super().__init__()
        self.conversation_id = conversation.id
        self.conversation_title = conversation.title or UNTITLED
        self.updated_at = conversation.updated_at
        self._when = relative_time(conversation.updated_at, now)

    def compose(self) -> ComposeResult:
        yield Label(self.conversation_title, classes="title", markup=False)  # titles are the user's text, [ and all
        yield Label(self._when, classes="time")

    def show_time(self, now: float) -> None:
        self.query_one(".time", Label).update(relative_time(self.updated_at, now))


class NoticeItem(ListItem):
    """A line in place of conversations ("No matches", "Search failed: …"); cannot be selected."""

    conversation_id = None

    def __init__(self, text: str):
        super().__init__(Label(text, markup=False), disabled=True)
        self.text = text


class Sidebar(Vertical):
    """A filter box over the list of saved conversations."""

    DEFAULT_CSS = """
    Sidebar {
        width: 32;
        height: 1fr;
        background: $panel;
        border-right: vkey $foreground 15%;

        #filter {
            margin: 0 0 1 0;
        }
        #conversations {
            height: 1fr;
            background: $panel;
        }
        ListItem {
            padding: 0 1;
            margin: 0 0 1 0;
            border-left: blank;
        }
        ListItem.-open {
            border-left: thick $accent;
        }
        ListView > ListItem.-highlight {
            background: $accent 30%;
        }
        ListView:focus > ListItem.-highlight {
            background: $accent;
            color: $text;
        }
        Label {
            width: 1fr;
            text-wrap: nowrap;
            text-overflow: ellipsis;
        }
        .title {
            text-style: bold;
        }
        .time {
            color: $text-muted;
        }
        NoticeItem {
            color: $text-muted;
            text-style: italic;
        }
        NoticeItem Label {
            text-wrap: wrap;
        }
    }
    """

    BINDINGS = [
        Binding("n", "new", "New"),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("slash", "focus_filter", "Search", show=False),
        # From the filter; the list moves its own cursor.
        Binding("down", "focus_list", "From the search to the list", show=False),
    ]

    class Open(Message):
        """Show this conversation (Enter or a click on it)."""

        def __init__(self, conversation_id: str):
            super().__init__()
            self.conversation_id = conversation_id

    class Rename(Message):
        """The user asked to rename this conversation."""

        def __init__(self, conversation_id: str):
            super().__init__()
            self.conversation_id = conversation_id

    class Delete(Message):
        """The user asked to delete this conversation (the app confirms first)."""

        def __init__(self, conversation_id: str):
            super().__init__()
            self.conversation_id = conversation_id

    class New(Message):
        """The user asked for a new chat."""

    def __init__(self, store: ConversationStore, clock: Callable[[], float] = time.time, *,
                 id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.store = store
        self.clock = clock
        self.open_id: str | None = None  # the conversation the app shows, marked in the list
        self._filter_timer: Timer | None = None
        # Rebuilds of the list run one at a time, in the order asked, so the last query wins.
        self._rebuilding = asyncio.Lock()

    def compose(self) -> ComposeResult:
        # Coming back to the filter (/) continues its text rather than replacing it with the next key.
        yield Input(placeholder="Search conversations", id="filter", select_on_focus=False)
        yield ListView(id="conversations")

    async def on_mount(self) -> None:
        self.set_interval(TIMES_REFRESH_S, self._show_times)
        await self.refresh_list()

    # Public API

    @property
    def selected_id(self) -> str | None:
        """The id of the conversation under the cursor; None when the list shows none."""
        item = self.query_one("#conversations", ListView).highlighted_child
        return getattr(item, "conversation_id", None)

    @property
    def filter_text(self) -> str:
        return self.query_one("#filter", Input).value

    def refresh_list(self) -> AwaitComplete:
        """Query the store again (keeping the filter) and show the result, keeping the cursor on
        the same conversation when it is still listed. Await the result to wait for the screen."""
        self._cancel_pending_filter()
        return AwaitComplete(self._show(self._query(self.filter_text), self.selected_id))

    def highlight(self, conversation_id: str | None) -> None:
        """Mark `conversation_id` as the open conversation (None: none is) and put the cursor on it."""
        self.open_id = conversation_id
        list_view = self.query_one("#conversations", ListView)
        for index, item in enumerate(list_view.children):
            open_here = conversation_id is not None and getattr(item, "conversation_id", None) == conversation_id
            item.set_class(open_here, "-open")
            if open_here:
                list_view.index = index

    # Querying

    def _query(self, text: str) -> list[ListItem]:
        """The items for filter `text`: conversations, or one notice saying why there are none."""
        text = text.strip()
        try:
            conversations = self.store.list(limit=MAX_ROWS)
        except StorageError as exc:
            return [NoticeItem(f"Conversations could not be listed: {exc}")]
        if text:
            try:
                conversations = filter_conversations(conversations, text, self._found_in_messages(text, conversations))
            except StorageError as exc:
                return [NoticeItem(f"Search failed: {exc}")]
        if not conversations:
            return [NoticeItem("No conversation matches." if text else "No conversations yet.")]
        now = self.clock()
        return [ConversationItem(c, now) for c in conversations]

    def _found_in_messages(self, text: str, listed: list[Conversation]) -> list[Conversation]:
        """The conversations with a message holding every word of `text`. Those older than the
        listed rows are read one by one (the conversations table only), so search reaches them too."""
        by_id = {c.id: c for c in listed}
        found: dict[str, Conversation] = {}
        for hit in self.store.search(text, limit=SEARCH_HITS):
            if hit.conversation_id in found:
                continue
            if hit.conversation_id in by_id:
                found[hit.conversation_id] = by_id[hit.conversation_id]
                continue
            try:
                found[hit.conversation_id] = self.store.get(hit.conversation_id)
            except StorageError:  # deleted since the search answered
                pass
        return list(found.values())

    async def _show(self, items: list[ListItem], keep: str | None) -> None:
        """Replace the list with `items`, the cursor on `keep`, else on the open conversation
        (after a deletion, say), else on the first item."""
        async with self._rebuilding:
            list_view = self.query_one("#conversations", ListView)
            await list_view.clear()
            await list_view.extend(items)
            ids = [getattr(item, "conversation_id", None) for item in items]
            for item in items:
                item.set_class(self.open_id is not None and item.conversation_id == self.open_id, "-open")
            cursor_on = next((i for i in (keep, self.open_id) if i is not None and i in ids), None)
            list_view.index = ids.index(cursor_on) if cursor_on is not None else 0
            self.refresh_bindings()

    def _show_times(self) -> None:
        now = self.clock()
        for item in self.query(ConversationItem):
            item.show_time(now)

    # Filtering as you type

    @on(Input.Changed, "#filter")
    def _filter_changed(self) -> None:
        self._cancel_pending_filter()
        self._filter_timer = self.set_timer(FILTER_DELAY_S, self._apply_filter)

    async def _apply_filter(self) -> None:
        # Forget the timer first: refresh_list() stops a pending one, and stopping this one
        # would cancel the task running this very call.
        self._filter_timer = None
        await self.refresh_list()

    @on(Input.Submitted, "#filter")
    async def _filter_submitted(self) -> None:
        """Enter in the filter: show its result now and move to the list, where Enter opens."""
        if self._filter_timer is not None:
            await self.refresh_list()
        self.query_one("#conversations", ListView).focus()

    def _cancel_pending_filter(self) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None

    # Selection and keys

    @on(ListView.Selected, "#conversations")
    def _selected(self, event: ListView.Selected) -> None:
        event.stop()
        conversation_id = getattr(event.item, "conversation_id", None)
        if conversation_id is not None:
            self.post_message(self.Open(conversation_id))

    @on(ListView.Highlighted, "#conversations")
    def _highlighted(self) -> None:
        self.refresh_bindings()  # rename and delete show in the footer only with a conversation under the cursor

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("new", "rename", "delete") and self.query_one("#filter", Input).has_focus:
            return False  # those keys type into the filter there, so the footer should not offer them
        if action in ("rename", "delete") and self.selected_id is None:
            return False
        if action in ("new", "rename", "delete", "focus_filter"):
            return letters_act(self)
        return True

    def action_new(self) -> None:
        self.post_message(self.New())

    def action_rename(self) -> None:
        if self.selected_id is not None:
            self.post_message(self.Rename(self.selected_id))

    def action_delete(self) -> None:
        if self.selected_id is not None:
            self.post_message(self.Delete(self.selected_id))

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_list(self) -> None:
        self.query_one("#conversations", ListView).focus()
