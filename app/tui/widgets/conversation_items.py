"""The sidebar's rows: a saved conversation (its title and when it was last active) or a notice in place
of conversations, and how the list is ordered and filtered by title."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date

from textual.app import ComposeResult
from textual.widgets import Label, ListItem

from storage.db.records import Conversation

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
