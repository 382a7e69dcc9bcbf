"""The panels around the chat: conversation settings, the inspector, the keys help, and moving
focus to the messages. A mixin of KvchatApp."""

from __future__ import annotations

from app.backend import is_remote, remote_models
from app.local_models import find_local_models
from app.screens.help import HelpScreen
from app.screens.settings import ChatSettings, SettingsScreen
from app.widgets.chat_view import ChatView
from app.widgets.inspector import Inspector
from app.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.sidebar import Sidebar
from storage.db import StorageError


class PanelActions:
    """Needs: self.session, self.engine, self.model_spec, self.generating, self._reload (KvchatApp)."""



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

    def action_help(self) -> None:
        sections = [("Anywhere", self.BINDINGS), ("In the message box", PromptInput.HELP_BINDINGS),
                    ("On a message (Tab or Ctrl+↑ to reach one)", MessageView.BINDINGS),
                    ("On your message", UserMessageView.BINDINGS), ("On a reply", AssistantMessageView.BINDINGS),
                    ("In the conversation list", Sidebar.BINDINGS)]
        self.push_screen(HelpScreen(sections))

    def action_focus_messages(self) -> None:
        views = self.query_one(ChatView).views()
        if views:
            views[-1].focus()
            views[-1].scroll_visible()

