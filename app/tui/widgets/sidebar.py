"""The conversation sidebar: saved conversations newest first, filtered as you type.

It only reads the store (the conversations table, plus full-text search while filtering), so it
stays instant however long the conversations are. Opening, renaming, deleting and starting a chat
are posted as messages; the app does them and then calls refresh_list(). The list's single-letter
keys act only when the app says so (see letter_keys.py).

`t` switches between the saved conversations and the trash (deleted ones, kept 30 days), where Enter
restores one. Another kvchat or the CLI may change the database meanwhile: check_for_changes() reads it
again only when SQLite says it changed (every DATA_CHECK_S, and when the app is focused).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Label, ListItem, ListView

from app.tui.widgets.conversation_items import ConversationItem, NoticeItem, filter_conversations
from app.tui.widgets.letter_keys import letters_act
from storage.db.conversations import Conversation, ConversationStore
from storage.errors import StorageError

MAX_ROWS = 500  # conversations loaded into the list; older ones are reached by searching
SEARCH_HITS = 200  # matching messages asked of the search (several may share a conversation)
FILTER_DELAY_S = 0.15  # typing re-queries once the keys pause this long, not on every key
TIMES_REFRESH_S = 30.0  # "just now" becomes "1 min ago" without a re-query
DATA_CHECK_S = 3.0  # how often the list looks whether another process changed the database (one PRAGMA)
TRASH_TITLE = "Trash · Enter restores · t: saved ones"


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
        #trash-title {
            display: none;
            padding: 0 1;
            background: $warning 20%;
        }
        &.-trash #trash-title {
            display: block;
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
        Binding("t", "toggle_trash", "Trash"),
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

    class Restore(Message):
        """The user asked to take this conversation out of the trash (Enter on it in the trash)."""

        def __init__(self, conversation_id: str):
            super().__init__()
            self.conversation_id = conversation_id

    def __init__(self, store: ConversationStore, clock: Callable[[], float] = time.time, *,
                 id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.store = store
        self.clock = clock
        self.open_id: str | None = None  # the conversation the app shows, marked in the list
        self._filter_timer: Timer | None = None
        # Rebuilds of the list run one at a time, in the order asked, so the last query wins.
        self._rebuilding = asyncio.Lock()
        self.showing_trash = False  # the list shows the trash instead of the saved conversations
        self._data_version: int | None = None  # the database's, as of the last read (check_for_changes)

    def compose(self) -> ComposeResult:
        # Coming back to the filter (/) continues its text rather than replacing it with the next key.
        yield Label(TRASH_TITLE, id="trash-title")
        yield Input(placeholder="Search conversations", id="filter", select_on_focus=False)
        yield ListView(id="conversations")

    async def on_mount(self) -> None:
        self.set_interval(TIMES_REFRESH_S, self._show_times)
        self.set_interval(DATA_CHECK_S, self.check_for_changes)
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
        self._data_version = self._read_data_version()
        return AwaitComplete(self._show(self._query(self.filter_text), self.selected_id))

    def show_trash(self, trash: bool) -> AwaitComplete:
        """List the trash (True) or the saved conversations (False)."""
        self.showing_trash = trash
        self.set_class(trash, "-trash")
        self.query_one("#filter", Input).placeholder = "Search the trash" if trash else "Search conversations"
        return self.refresh_list()

    async def check_for_changes(self) -> bool:
        """Read the list again if another connection changed the database since it was read; True if so."""
        version = self._read_data_version()
        if version is None or version == self._data_version:
            return False
        await self.refresh_list()
        return True

    def _read_data_version(self) -> int | None:
        try:
            return self.store.data_version()
        except StorageError:
            return None

    def highlight(self, conversation_id: str | None) -> None:
        """Mark `conversation_id` as the open conversation (None: none is) and put the cursor on it."""
        self.open_id = conversation_id
        try:
            list_view = self.query_one("#conversations", ListView)
        except NoMatches:  # its children are being removed: the app is closing (a reply saved as the user quit)
            return
        for index, item in enumerate(list_view.children):
            open_here = conversation_id is not None and getattr(item, "conversation_id", None) == conversation_id
            item.set_class(open_here, "-open")
            if open_here:
                list_view.index = index

    # Querying

    def _query(self, text: str) -> list[ListItem]:
        """The items for filter `text`: conversations, or one notice saying why there are none."""
        text = text.strip()
        if self.showing_trash:
            return self._query_trash(text)
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

    def _query_trash(self, text: str) -> list[ListItem]:
        """The trash's items for filter `text` (titles only: the search index leaves the trash out)."""
        try:
            trashed = self.store.trashed()[:MAX_ROWS]
        except StorageError as exc:
            return [NoticeItem(f"The trash could not be listed: {exc}")]
        if text:
            trashed = filter_conversations(trashed, text)
        if not trashed:
            return [NoticeItem("No conversation in the trash matches." if text else "The trash is empty.")]
        now = self.clock()
        return [ConversationItem(c, now) for c in trashed]

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
            self.post_message(self.Restore(conversation_id) if self.showing_trash else self.Open(conversation_id))

    @on(ListView.Highlighted, "#conversations")
    def _highlighted(self) -> None:
        self.refresh_bindings()  # rename and delete show in the footer only with a conversation under the cursor

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("new", "rename", "delete", "toggle_trash") and self.query_one("#filter", Input).has_focus:
            return False  # those keys type into the filter there, so the footer should not offer them
        if action in ("rename", "delete") and (self.selected_id is None or self.showing_trash):
            return False  # in the trash, Enter restores; deleting for good is the CLI's (kvchat delete --permanently)
        if action in ("new", "rename", "delete", "focus_filter", "toggle_trash"):
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

    async def action_toggle_trash(self) -> None:
        await self.show_trash(not self.showing_trash)

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_focus_list(self) -> None:
        self.query_one("#conversations", ListView).focus()
