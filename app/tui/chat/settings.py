"""A conversation's settings (system prompt, sampling, model, alternatives) as the settings screen (Ctrl+O)
and the slash commands change them, also while no model is loaded. ConversationSettings is the app's; the
settings screen itself is screens/settings.py."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.chat.backend_loader import is_remote, remote_models
from app.chat.local_models import LocalModel, find_local_models
from app.chat.sampling_settings import sampling_params
from storage.usage import one_line, usage
from app.tui.chat.alternatives import PREFERENCE
from app.tui.screens.settings import ChatSettings, SettingsScreen
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.status_bar import StatusBar
from storage.errors import StorageError

if TYPE_CHECKING:
    from textual.app import App

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.saved.conversation import Storage
    from app.chat.session import ChatSession
    from app.tui.model_session import ModelSession
    from storage.preferences import Preferences


@runtime_checkable  # so a test can check that KvchatApp keeps it
class SettingsHost(Protocol):
    """What ConversationSettings uses of the app (KvchatApp), besides Textual's App."""

    storage: Storage
    config: Config
    overrides: dict  # sampling settings from the command line
    alternatives: int  # how many replies "regenerate N" writes at once
    system: str | None  # the system prompt of new conversations
    engine: Backend | None
    session: ChatSession | None
    conversation_id: str | None
    model_session: ModelSession  # loads the model chosen
    preferences: Preferences  # where the number of alternatives is remembered

    @property
    def generating(self) -> bool: ...


if TYPE_CHECKING:
    class _Host(SettingsHost, App):
        """What a type checker takes the app for: a Textual App that is a SettingsHost."""


class ConversationSettings:
    """The shown conversation's settings, and those saved while it had no session (the app's)."""

    def __init__(self, app: _Host):
        self.app = app
        # What was saved in the settings while no model was loaded: (the conversation shown then, its
        # settings), applied once that conversation's session is ready with the model chosen.
        self._pending: tuple[str | None, ChatSettings] | None = None

    def _no_model(self) -> bool:
        """The model (or server) failed to load, and no load is under way."""
        return self.app.engine is None and self.app.query_one(StatusBar).phase == "no model"

    def current(self) -> ChatSettings:
        """The shown conversation's settings: its session's, or, while there is none (no model loaded),
        those it will open with."""
        app = self.app
        if app.session is not None:
            return ChatSettings(app.session.system, app.session.params, app.model_session.spec, app.alternatives)
        if self._pending is not None and self._pending[0] == app.conversation_id:
            return dataclasses.replace(self._pending[1], model=app.model_session.spec, alternatives=app.alternatives)
        system, saved = app.system, None
        if app.conversation_id is not None:
            try:
                conversation = app.storage.conversations.get(app.conversation_id)
                system, saved = conversation.system, conversation.params
            except StorageError:
                pass  # opening it says why; the defaults stand in meanwhile
        config = getattr(app, "config", None)  # the config file's [sampling], layered as ModelSession does
        params = sampling_params(argparse.Namespace(**app.overrides), saved, config)
        return ChatSettings(system, params, app.model_session.spec, app.alternatives)

    def model_choices(self) -> list[LocalModel]:
        """The models the settings screen and /model offer: the server's, or those on this machine."""
        app = self.app
        if is_remote(app.engine):
            return remote_models(app.engine, app.model_session.spec)
        if app.engine is None and app.model_session.retry_load:  # the server was unreachable: it lists none
            return []
        return find_local_models(app.model_session.spec)

    def open(self) -> None:
        """Ctrl+O. Also while no model is loaded (it failed), so that another one can be chosen and loaded."""
        app = self.app
        if app.session is None and not self._no_model():
            app.notify("Settings open once the model and the conversation are ready.", severity="warning")
            return
        current = self.current()
        window = app.engine.context_window if app.engine else None
        app.push_screen(SettingsScreen(current, self.model_choices(), window, app.config.max_reply_tokens or None,
                                       self._disk_line()),
                        lambda result: app.run_worker(self.apply(current, result, load_again=True)))

    def _disk_line(self) -> str:
        """What kvchat keeps on disk, in one line (an unreadable folder: nothing rather than an error)."""
        try:
            return one_line(usage(self.app.storage.kv.cap_bytes / 1e9))
        except (OSError, StorageError):
            return ""

    async def apply(self, old: ChatSettings, new: ChatSettings | None, load_again: bool = False) -> bool:
        """Make `new` the shown conversation's settings (`old`: what they were when the change began).
        `load_again`: if the model failed to load, try the same one again (the settings screen's Save).
        False if they could not be (said why)."""
        app = self.app
        if new is not None and new.alternatives != old.alternatives:  # the chat's: taken at once, even mid-reply
            self._set_alternatives(new.alternatives)
            old = dataclasses.replace(old, alternatives=new.alternatives)
        if new is None or new == old and app.session is not None:
            return new is not None
        if app.session is None:
            return await self._without_session(old, new, load_again)
        if app.generating:
            app.notify("Stop the reply first (Esc); the settings were not changed.", severity="warning")
            return False
        chat = app.query_one(ChatView)
        try:
            app.session.change_settings(new.system, new.params)
        except StorageError as exc:
            app.notify(str(exc), severity="error", timeout=10)
            return False
        if new.system != old.system:
            await chat.add_note("System prompt changed" + (f": {new.system}" if new.system else " to the model's "
                                "default") + ". The next reply recomputes the conversation.")
        if new.model != old.model:
            await chat.add_note(f"Model changed to {new.model or 'the default model'}: it loads now, and the "
                                "next reply recomputes the conversation with it.")
            app.model_session.load_model(new.model)
        return True

    def _set_alternatives(self, count: int) -> None:
        """The new number of alternatives: used from now on, and remembered."""
        self.app.alternatives = count
        try:
            self.app.preferences.set(PREFERENCE, count)
        except OSError as exc:
            self.app.notify(f"The number of alternatives could not be saved ({exc.strerror or exc}); it holds "
                            "until kvchat quits.", severity="warning")

    async def _without_session(self, old: ChatSettings, new: ChatSettings, load_again: bool) -> bool:
        """No session: the model failed to load (another model chosen loads now; with `load_again`, the same
        one too), or it is still loading. The system prompt and sampling wait for the conversation to open."""
        app, no_model = self.app, self._no_model()
        if not no_model and new.model != old.model:
            app.notify("The model is still loading; choose another once it is ready.", severity="warning")
            return False
        self._pending = (app.conversation_id, new)
        if no_model and (load_again or new.model != old.model):
            await app.query_one(ChatView).add_note(f"Loading {new.model or 'the default model'}.")
            app.model_session.load_model(new.model)
        elif (new.system, new.params) != (old.system, old.params):
            app.notify("Kept for this conversation: it applies once a model is loaded and the conversation "
                       "is open.", timeout=6)
        return True

    def session_ready(self, session: ChatSession) -> None:
        """The shown conversation's session is ready: the settings saved meanwhile are applied to it."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == self.app.conversation_id and \
                (pending[1].system, pending[1].params) != (session.system, session.params):
            try:
                session.change_settings(pending[1].system, pending[1].params)
            except StorageError as exc:
                self.app.notify(str(exc), severity="error", timeout=10)
