"""The panels around the chat: conversation settings, the inspector, the keys help, and where the
focus and the keys go. A mixin of KvchatApp."""

from __future__ import annotations

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea

from app.backend import is_remote, remote_models
from app.local_models import find_local_models
from app.screens.help import HelpScreen
from app.screens.settings import ChatSettings, SettingsScreen
from app.widgets.chat_view import ChatView
from app.widgets.inspector import Inspector
from app.widgets.letter_keys import NAVIGATION_KEYS
from app.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.sidebar import Sidebar
from storage.db import StorageError


class PanelActions:
    """Needs: self.session, self.engine, self.model_spec, self.generating, self._reload (KvchatApp)."""

    # Where the user moved with the arrow keys ("messages" or "conversations"): the single-letter
    # keys act there, until the focus goes somewhere else. None: nowhere, typing goes to the box.
    _navigating: str | None = None

    def action_settings(self) -> None:
        if self.session is None:
            self.notify("Settings open once the model and the conversation are ready.", severity="warning")
            return
        current = ChatSettings(self.session.system, self.session.params, self.model_spec)
        window = self.engine.context_window if self.engine else None
        models = remote_models(self.engine, self.model_spec) if is_remote(self.engine) else \
            find_local_models(self.model_spec)
        self.push_screen(SettingsScreen(current, models, window),
                         lambda result: self.run_worker(self._apply_settings(current, result)))

    async def _apply_settings(self, old: ChatSettings, new: ChatSettings | None) -> None:
        if new is None or new == old:
            return
        if self.generating:
            self.notify("Stop the reply first (Esc); the settings were not changed.", severity="warning")
            return
        chat = self.query_one(ChatView)
        try:
            self.session.change_settings(new.system, new.params)
        except StorageError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        if new.system != old.system:
            await chat.add_note("System prompt changed" + (f": {new.system}" if new.system else " to the model's "
                                "default") + ". The next reply recomputes the conversation.")
        if new.model != old.model:
            self.model_spec = new.model
            await chat.add_note(f"Model changed to {new.model or 'the default model'}: it loads now, and the "
                                "next reply recomputes the conversation with it.")
            self.engine = self.session = None
            self._reload()

    def action_toggle_inspector(self) -> None:
        inspector = self.query_one(Inspector)
        inspector.display = not inspector.display
        if inspector.display:
            focused = self.focused
            self._inspect(focused if isinstance(focused, AssistantMessageView) else
                          self.query_one(ChatView).last_reply())

    def _inspect(self, view: AssistantMessageView | None) -> None:
        inspector = self.query_one(Inspector)
        self._inspecting_live = view is None or view is self.reply
        if self._inspecting_live:
            inspector.show(None)
        else:
            inspector.show(view.message.stats, f"reply {view.index + 1}")

    def on_descendant_focus(self, event) -> None:
        if isinstance(event.widget, AssistantMessageView) and self.query_one(Inspector).display:
            self._inspect(event.widget)
        # The focus reached by a click, Tab or Ctrl+B is not navigating. Judged by where the focus is
        # now, not by the event, which may be older than the arrow key that moved it since.
        if self._navigating is not None and self._key_place(self.focused) != self._navigating:
            self._set_navigating(None)

    # ---- where the keys go: typing to the message box, letters only where the user navigated

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

    def _set_navigating(self, place: str | None) -> None:
        if place != self._navigating:
            self._navigating = place
            self.screen.refresh_bindings()  # the footer shows the letters of that place, or dims them

    def letters_act(self, widget: Widget) -> bool:
        """Do `widget`'s single-letter keys act now? Only where the user has navigated with the arrow
        keys (or Ctrl+Up) since the focus arrived (see letter_keys.py)."""
        place = self._key_place(widget)
        return place is not None and place == self._navigating

    def key_goes_to_prompt(self, event: events.Key) -> bool:
        """Called for each key before Textual routes it. A navigation key pressed on a message or the
        conversation list makes its letters act from now on; True for a printable key pressed there
        before that: typing meant for the message box, where the app sends it instead."""
        place = self._key_place(self.focused)
        if place is None:
            return False
        if event.key in NAVIGATION_KEYS:
            self._set_navigating(place)
            return False
        return event.is_printable and place != self._navigating

    def action_help(self) -> None:
        sections = [("Anywhere", self.BINDINGS), ("In the message box", PromptInput.HELP_BINDINGS),
                    ("On a message (Tab or Ctrl+↑ to reach one)", MessageView.BINDINGS),
                    ("On your message", UserMessageView.BINDINGS), ("On a reply", AssistantMessageView.BINDINGS),
                    ("In the conversation list", Sidebar.BINDINGS)]
        self.push_screen(HelpScreen(sections))

    def action_focus_messages(self) -> None:
        """Ctrl+Up: to the last message, navigating (its letter keys act)."""
        views = self.query_one(ChatView).views()
        if views:
            self._set_navigating("messages")
            self.screen.set_focus(views[-1])  # now, so no older focus event can undo the navigating

