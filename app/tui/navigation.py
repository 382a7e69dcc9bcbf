"""Where the keys go: typing goes to the message box wherever the focus is, and the single-letter keys of a
message or of the conversation list act only where the user moved with the arrow keys (see
widgets/letter_keys.py). Navigation is the app's, which asks it before Textual routes each key."""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.widget import Widget
from textual.widgets import Input, TextArea

from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.letter_keys import NAVIGATION_KEYS
from app.tui.widgets.sidebar import Sidebar


class Navigation:
    """Where the user navigated to with the arrow keys, if anywhere (the app's)."""

    def __init__(self, app: App):
        self.app = app
        # Where the user moved with the arrow keys ("messages" or "conversations"): the single-letter
        # keys act there, until the focus goes somewhere else. None: nowhere, typing goes to the box.
        self._place: str | None = None

    def _key_place(self, widget: Widget | None) -> str | None:
        """Where `widget` is, for its single-letter keys: "messages" (the chat view and the messages in
        it), "conversations" (the sidebar's list), or None (text fields, dialogs, everything else)."""
        if widget is None or isinstance(widget, (Input, TextArea)):
            return None
        for node in widget.ancestors_with_self:
            if isinstance(node, ChatView):
                return "messages"
            if isinstance(node, Sidebar):
                return "conversations"
        return None

    def _set_place(self, place: str | None) -> None:
        if place != self._place:
            self._place = place
            self.app.screen.refresh_bindings()  # the footer shows the letters of that place, or dims them

    def letters_act(self, widget: Widget) -> bool:
        """Do `widget`'s single-letter keys act now? Only where the user has navigated with the arrow
        keys (or Ctrl+Up) since the focus arrived (see letter_keys.py)."""
        place = self._key_place(widget)
        return place is not None and place == self._place

    def key_goes_to_prompt(self, event: events.Key) -> bool:
        """Called for each key before Textual routes it. A navigation key pressed on a message or the
        conversation list makes its letters act from now on; True for a printable key pressed there
        before that: typing meant for the message box, where the app sends it instead."""
        place = self._key_place(self.app.focused)
        if place is None:
            return False
        if event.key in NAVIGATION_KEYS:
            self._set_place(place)
            return False
        return event.is_printable and place != self._place

    def focus_moved(self) -> None:
        """The focus reached by a click, Tab or Ctrl+B is not navigating. Judged by where the focus is now,
        not by the focus event, which may be older than the arrow key that moved it since."""
        if self._place is not None and self._key_place(self.app.focused) != self._place:
            self._set_place(None)

    def focus_messages(self) -> None:
        """Ctrl+Up: to the last message, navigating (its letter keys act)."""
        views = self.app.query_one(ChatView).views()
        if views:
            self._set_place("messages")
            self.app.screen.set_focus(views[-1])  # now, so no older focus event can undo the navigating
