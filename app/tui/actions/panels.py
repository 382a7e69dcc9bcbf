"""The panels around the chat: conversation settings, the inspector, the keys help, and where the
focus and the keys go. A mixin of KvchatApp."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual import events
from textual.widget import Widget
from textual.widgets import Input, TextArea

from app.tui import slash_commands
from app.chat.backend_loader import is_remote, remote_models
from app.chat.local_models import LocalModel, find_local_models
from app.chat.sampling_settings import sampling_params
from app.tui.screens.help import HelpScreen
from app.tui.screens.settings import ChatSettings, SettingsScreen
from app.tui.token_meter import count_tokens, estimate_tokens, meter_text, room_left
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.letter_keys import NAVIGATION_KEYS
from app.tui.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status_bar import StatusBar
from storage.errors import StorageError
from storage.usage import one_line, usage

if TYPE_CHECKING:
    from textual.app import App

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.saved.conversation import Storage
    from app.chat.session import ChatSession

HELP_NOTE = ("Typing goes to the message box wherever the focus is. On a message or in the conversation list, "
             "the letter keys act once you have moved there with the arrow keys (or Ctrl+↑); Esc always "
             "comes back to the box.")


@runtime_checkable  # so a test can check that KvchatApp keeps it
class PanelHost(Protocol):
    """What PanelActions uses of the app it is mixed into (KvchatApp), besides Textual's App."""

    storage: Storage
    config: Config
    overrides: dict  # sampling settings from the command line
    alternatives: int  # how many replies "regenerate N" writes at once
    system: str | None  # the system prompt of new conversations
    model_spec: str | None
    engine: Backend | None
    session: ChatSession | None
    conversation_id: str | None
    reply: AssistantMessageView | None  # the reply being written
    editing: int | None  # the index of the user message being edited
    _inspecting_live: bool  # the inspector follows the reply being written
    _retry_load: bool  # the last load failed in a way that trying again may fix

    @property
    def generating(self) -> bool: ...

    def _reload(self) -> None: ...

    def set_alternatives(self, count: int) -> None: ...


if TYPE_CHECKING:
    class _Host(PanelHost, App):
        """What a type checker takes `self` for: a Textual App that is a PanelHost."""
else:
    _Host = object


class PanelActions(_Host):
    """A mixin of KvchatApp; what it needs of the app is PanelHost."""

    # Where the user moved with the arrow keys ("messages" or "conversations"): the single-letter
    # keys act there, until the focus goes somewhere else. None: nowhere, typing goes to the box.
    _navigating: str | None = None

    # What was saved in the settings while no model was loaded: (the conversation shown then, its
    # settings), applied once that conversation's session is ready with the model chosen.
    _pending_settings: tuple[str | None, ChatSettings] | None = None

    def _no_model(self) -> bool:
        """The model (or server) failed to load, and no load is under way."""
        return self.engine is None and self.query_one(StatusBar).phase == "no model"

    def current_settings(self) -> ChatSettings:
        """The shown conversation's settings: its session's, or, while there is none (no model loaded),
        those it will open with."""
        if self.session is not None:
            return ChatSettings(self.session.system, self.session.params, self.model_spec, self.alternatives)
        if self._pending_settings is not None and self._pending_settings[0] == self.conversation_id:
            return dataclasses.replace(self._pending_settings[1], model=self.model_spec, alternatives=self.alternatives)
        system, saved = self.system, None
        if self.conversation_id is not None:
            try:
                conversation = self.storage.conversations.get(self.conversation_id)
                system, saved = conversation.system, conversation.params
            except StorageError:
                pass  # opening it says why; the defaults stand in meanwhile
        config = getattr(self, "config", None)  # the config file's [sampling], as _open_session layers it
        params = sampling_params(argparse.Namespace(**self.overrides), saved, config)
        return ChatSettings(system, params, self.model_spec, self.alternatives)

    def model_choices(self) -> list[LocalModel]:
        """The models the settings screen and /model offer: the server's, or those on this machine."""
        if is_remote(self.engine):
            return remote_models(self.engine, self.model_spec)
        if self.engine is None and self._retry_load:  # the server was unreachable: it lists none
            return []
        return find_local_models(self.model_spec)

    def action_settings(self) -> None:
        """Ctrl+O. Also while no model is loaded (it failed), so that another one can be chosen and loaded."""
        if self.session is None and not self._no_model():
            self.notify("Settings open once the model and the conversation are ready.", severity="warning")
            return
        current = self.current_settings()
        window = self.engine.context_window if self.engine else None
        self.push_screen(SettingsScreen(current, self.model_choices(), window, self.config.max_reply_tokens or None,
                                        self._disk_line()),
                         lambda result: self.run_worker(self._apply_settings(current, result, load_again=True)))

    def _disk_line(self) -> str:
        """What kvchat keeps on disk, in one line (an unreadable folder: nothing rather than an error)."""
        try:
            return one_line(usage(self.storage.kv.cap_bytes / 1e9))
        except (OSError, StorageError):
            return ""

    async def _apply_settings(self, old: ChatSettings, new: ChatSettings | None, load_again: bool = False) -> bool:
        """Make `new` the shown conversation's settings (`old`: what they were when the change began).
        `load_again`: if the model failed to load, try the same one again (the settings screen's Save).
        False if they could not be (said why)."""
        if new is not None and new.alternatives != old.alternatives:  # the chat's: taken at once, even mid-reply
            self.set_alternatives(new.alternatives)
            old = dataclasses.replace(old, alternatives=new.alternatives)
        if new is None or new == old and self.session is not None:
            return new is not None
        if self.session is None:
            return await self._settings_without_session(old, new, load_again)
        if self.generating:
            self.notify("Stop the reply first (Esc); the settings were not changed.", severity="warning")
            return False
        chat = self.query_one(ChatView)
        try:
            self.session.change_settings(new.system, new.params)
        except StorageError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return False
        if new.system != old.system:
            await chat.add_note("System prompt changed" + (f": {new.system}" if new.system else " to the model's "
                                "default") + ". The next reply recomputes the conversation.")
        if new.model != old.model:
            self.model_spec = new.model
            await chat.add_note(f"Model changed to {new.model or 'the default model'}: it loads now, and the "
                                "next reply recomputes the conversation with it.")
            self.engine = self.session = None
            self._reload()
        return True

    async def _settings_without_session(self, old: ChatSettings, new: ChatSettings, load_again: bool) -> bool:
        """No session: the model failed to load (another model chosen loads now; with `load_again`, the same
        one too), or it is still loading. The system prompt and sampling wait for the conversation to open."""
        no_model = self._no_model()
        if not no_model and new.model != old.model:
            self.notify("The model is still loading; choose another once it is ready.", severity="warning")
            return False
        self._pending_settings = (self.conversation_id, new)
        if no_model and (load_again or new.model != old.model):
            self.model_spec = new.model
            await self.query_one(ChatView).add_note(f"Loading {new.model or 'the default model'}.")
            self._reload()
        elif (new.system, new.params) != (old.system, old.params):
            self.notify("Kept for this conversation: it applies once a model is loaded and the conversation "
                        "is open.", timeout=6)
        return True

    def on_session_ready(self, message) -> None:
        # Runs after KvchatApp.on_session_ready (Textual calls the handler of every class in the MRO).
        session = self.session
        if session is None or session is not message.session:
            return  # it was for a conversation no longer shown
        pending, self._pending_settings = self._pending_settings, None
        if pending is not None and pending[0] == self.conversation_id and \
                (pending[1].system, pending[1].params) != (session.system, session.params):
            try:
                session.change_settings(pending[1].system, pending[1].params)
            except StorageError as exc:
                self.notify(str(exc), severity="error", timeout=10)
        # The model's tokenizer and the conversation's tokens are known now: the meter can count.
        prompt = self.query_one(PromptInput)
        prompt.meter = self.meter_reading
        prompt.refresh_meter()

    # ---- the message box's token meter (set up in on_session_ready)

    def on_reply_done(self, message) -> None:
        # After ReplyActions.on_reply_done: the reply took room in the context window.
        self.query_one(PromptInput).refresh_meter()

    def meter_reading(self, text: str) -> tuple[str, bool]:
        """The meter of the message box holding `text`: its tokens and the context window's room left
        (see token_meter.py), and whether it is over. Runs on a worker thread (it tokenizes)."""
        engine, session = self.engine, self.session
        if engine is None or session is None:
            return meter_text(estimate_tokens(text), 0, 0), False
        count = count_tokens(text, None if is_remote(engine) else engine.tokenizer)
        window, used = engine.context_window, self.context_used()
        return meter_text(count, window, used), bool(window) and room_left(count, window, used) < 1

    def context_used(self) -> int:
        """Tokens of the conversation the next message follows (up to the message being edited, when one
        is): the token ids the model saw, else its text counted as the meter counts (a new chat's system
        prompt, a conversation made with another tokenizer, a remote server's). May tokenize: a worker
        thread's call."""
        session, engine = self.session, self.engine
        if session is None or engine is None:  # the model is being changed
            return 0
        before = session.messages if self.editing is None else session.messages[:self.editing]
        remote = is_remote(engine)
        if not remote:
            seen = len(session.seen_ids) if self.editing is None else (before[-1].token_end if before else 0)
            if seen:
                return seen
        texts = [session.system or ""] + [message.content for message in before]
        return count_tokens("\n".join(texts), None if remote else engine.tokenizer).tokens

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
        letters = "letters act after an arrow key"
        commands = [(slash_commands.usage(name), does) for name, (_, does) in slash_commands.COMMANDS.items()]
        commands.append((f"{slash_commands.ESCAPE}TEXT", "Send a message that starts with a single /"))
        sections = [("Anywhere", self.BINDINGS), ("In the message box", PromptInput.HELP_BINDINGS),
                    ("Slash commands, typed at the start of the box", commands),
                    (f"On a message (Ctrl+↑ to reach one; {letters})", [*MessageView.BINDINGS, *ChatView.BINDINGS]),
                    ("On your message", UserMessageView.BINDINGS), ("On a reply", AssistantMessageView.BINDINGS),
                    (f"In the conversation list (Ctrl+B; {letters})", Sidebar.BINDINGS)]
        self.push_screen(HelpScreen(sections, [HELP_NOTE]))

    def action_focus_messages(self) -> None:
        """Ctrl+Up: to the last message, navigating (its letter keys act)."""
        views = self.query_one(ChatView).views()
        if views:
            self._set_navigating("messages")
            self.screen.set_focus(views[-1])  # now, so no older focus event can undo the navigating

