"""The model and the shown conversation's session, made ready on the engine thread.

The model loads (or the server is reached), and then the shown conversation's ChatSession opens (restoring
its K/V), as jobs on the engine thread (engine_thread.py); they report through typed messages
(engine_events.py), which the app hands here. A message typed before both are ready waits here and is sent
once they are. ModelSession is the app's (KvchatApp), which shows the conversations and routes the keys.
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.chat.backend_loader import LoadBackend, chat_session, is_remote
from app.chat.errors import USER_FACING_ERRORS
from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.chat.reply.limits import reply_limits
from app.chat.sampling_settings import sampling_params
from app.chat.saved.conversation import SavedConversation
from app.remote.stream import RemoteError
from app.tui.context_meter import conversation_tokens
from app.tui.engine_events import EngineFailed, EngineReady, LoadProgress, SessionFailed, SessionReady
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar
from engine import EngineError

if TYPE_CHECKING:
    from textual.app import App

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.saved.conversation import Storage
    from app.chat.session import ChatSession
    from app.tui.engine_thread import EngineThread


class _Chat(Protocol):
    """What ModelSession uses of the chat pane (chat/pane.py, which uses this module: not imported here)."""

    editing: int | None  # the user message being edited, if any

    def meter_ready(self) -> None: ...


class _Settings(Protocol):
    """What ModelSession uses of the conversation's settings (chat/settings.py, which uses this module)."""

    def session_ready(self, session: ChatSession) -> None: ...


@runtime_checkable  # so a test can check that KvchatApp keeps it
class ModelSessionHost(Protocol):
    """What ModelSession uses of the app (KvchatApp), besides Textual's App."""

    storage: Storage
    config: Config
    overrides: dict  # sampling settings from the command line
    system: str | None  # the system prompt of new conversations
    conversation_id: str | None  # the conversation shown (None: a new one)
    engine_thread: EngineThread
    chat: _Chat
    settings: _Settings


if TYPE_CHECKING:
    class _Host(ModelSessionHost, App):
        """What a type checker takes the app for: a Textual App that is a ModelSessionHost."""


class ModelSession:
    """The engine and the shown conversation's session, as the UI knows them (the app's)."""

    def __init__(self, app: _Host, load_engine: LoadBackend, spec: str | None):
        """`load_engine(spec, progress)`: the embedded engine or a remote server; `spec`: the model to load."""
        self.app = app
        self._load_engine = load_engine
        self.spec = spec
        self.engine: Backend | None = None  # the UI's view of the engine: set when EngineReady arrives
        self._loaded: Backend | None = None  # the engine thread's: set as soon as a load ends
        self.session: ChatSession | None = None  # the shown conversation's, once it is ready
        self._ticket = 0  # which conversation opening the next SessionReady must belong to
        self._queued_text: str | None = None  # typed before the session was ready: sent when it is
        self.retry_load = False  # the last load failed in a way that trying again may fix (written here only)
        self._format_told: str | None = None  # the chat format notice shown for the loaded model (once)
        self._tools_told: str | None = None  # the tool format notice shown for the loaded model (once)
        self._closing = False

    def start(self) -> None:
        """The app is up: the model loads."""
        self.app.engine_thread.submit(lambda: self._load(self.spec))

    def close(self) -> None:
        """The app quits: a reply being written stops (kept as stopped); a model still loading finishes
        loading and then does nothing more."""
        self._closing = True
        if self.session is not None:
            self.session.cancel()

    # ---- the engine thread's jobs

    def _load(self, spec: str | None) -> None:
        """Engine thread: load the model (replacing any loaded one)."""
        self._loaded = None
        try:
            engine = self._load_engine(spec, lambda step: self.app.post_message(LoadProgress(step)))
        except EngineError as exc:
            self.app.post_message(EngineFailed(str(exc), retry=isinstance(exc, RemoteError)))
            return
        if not self._closing:
            self._loaded = engine
            self.app.post_message(EngineReady(engine))

    def _open_session(self, ticket: int, conversation_id: str | None) -> None:
        """Engine thread: the ChatSession of a conversation (restoring its K/V), or of a new one."""
        engine, app = self._loaded, self.app
        if engine is None or self._closing or ticket != self._ticket:
            return  # no model (already reported), quitting, or another conversation was opened since
        try:
            overrides = argparse.Namespace(**app.overrides)
            if conversation_id is None:  # it keeps no settings of its own until the user sets some
                saved = SavedConversation.new(app.storage, engine, app.system,
                                              sampling_params(overrides, None, app.config), settings={})
            else:
                saved = SavedConversation.open(app.storage, conversation_id)
            conversation = saved.conversation
            system = conversation.system if conversation else app.system
            params = sampling_params(overrides, conversation.params if conversation else None, app.config)
            session = chat_session(engine, system, params, saved, reply_limits(app.config))
        except USER_FACING_ERRORS as exc:
            app.post_message(SessionFailed(ticket, str(exc)))
            return
        app.post_message(SessionReady(ticket, session))

    # ---- the model

    def load_progress(self, message: LoadProgress) -> None:
        self.app.query_one(StatusBar).show("loading", message.step)

    def engine_ready(self, message: EngineReady) -> None:
        self.engine = engine = message.engine
        info = engine.info
        bar = self.app.query_one(StatusBar)
        bar.context_window = info.context_window
        bar.model, bar.device = info.model_name, f"{info.device} {info.dtype}".strip()
        bar.kv_cache = engine.cache_stats()
        bar.clear_reply()  # a reply's numbers from the model loaded before are not this one's
        self._format_told = self._tools_told = None  # a new model: its formats (if it lacks them) are told again
        prompt = self.app.query_one(PromptInput)
        window = info.context_window or None  # a server may not say
        prompt.context_window, prompt.max_chars = window, window and MAX_CHARS_PER_TOKEN * window
        bar.show("idle", f"{'connected' if is_remote(engine) else 'loaded'} in {info.load_ms / 1e3:.1f} s")
        if getattr(self.app, "tools", None) is not None and hasattr(engine, "prepare_grammar"):
            # The grammar engine's view of the vocabulary (about a second) is built now, not in the first
            # tool reply's time to first token; on a thread of its own, so the engine thread stays free.
            threading.Thread(target=_quietly(engine.prepare_grammar), name="kvchat-grammar", daemon=True).start()

    def engine_failed(self, message: EngineFailed) -> None:
        self.retry_load = message.retry
        self.app.query_one(StatusBar).show("no model", message.error)
        title = "The server could not be used" if message.retry else "The model could not be loaded"
        self.app.notify(message.error, title=title, severity="error", timeout=30)

    def load_model(self, spec: str | None) -> None:
        """Another model chosen in the settings (or the same one, to try again): it loads now, and the
        conversation shown opens again with it."""
        self.spec = spec
        self.engine = self.session = None
        self._reload()

    def _reload(self) -> None:
        """Load self.spec again (a new model, or a server that may be up now), then open the conversation
        shown with it."""
        self.retry_load = False
        self.app.query_one(StatusBar).show("loading", "")
        ticket, target = self._ticket, self.app.conversation_id
        self.app.engine_thread.submit(lambda: self._load(self.spec))
        self.app.engine_thread.submit(lambda: self._open_session(ticket, target))

    # ---- the shown conversation's session

    def leave(self) -> None:
        """Another conversation is shown: the session (and a message typed for it) was the one shown before's,
        and a SessionReady on its way is ignored."""
        self._ticket += 1
        self._queued_text = None
        self.session = None

    def open(self, restoring: bool) -> None:
        """The shown conversation's session opens on the engine thread (after the model, if it is loading);
        `restoring`: it is a saved one, whose K/V is restored."""
        if self._loaded is not None or self.engine is not None:
            self.app.query_one(StatusBar).show("opening", "restoring the KV cache" if restoring else "")
        ticket, target = self._ticket, self.app.conversation_id
        self.app.engine_thread.submit(lambda: self._open_session(ticket, target))

    def session_ready(self, message: SessionReady) -> None:
        if message.ticket != self._ticket:
            return
        app = self.app
        session = self.session = message.session
        if session.notice:
            app.notify(session.notice, severity="warning", timeout=10)
        conversation = session.saved.conversation if session.saved else None
        bar = app.query_one(StatusBar)
        # A model without a chat template: which format kvchat writes it in, said once (not again for each
        # conversation opened in the same one); the inspector names it with each reply.
        told = session.format_notice
        if told and told != self._format_told:
            self._format_told = told
            app.notify(told, title="No chat template", timeout=10)
        tools = getattr(app, "tools", None)
        tool_told = session.prompt.tool_format_notice if tools is not None and tools.specs() else None
        if tool_told and tool_told != self._tools_told:  # once per model, as the chat format's
            self._tools_told = tool_told
            app.notify(tool_told, title="No tool format", timeout=10)
        if conversation and self.engine and conversation.model != self.engine.info.model_name:
            app.notify(f"This conversation was made with {conversation.model}; replies now come from "
                       f"{self.engine.info.model_name}.", timeout=10)
        replies = [m for m in session.messages if m.role == "assistant"]
        bar.context_used = conversation_tokens(session.seen_ids, replies[-1].stats if replies else None)
        bar.show("idle", session.chat_format.short if session.chat_format else "")
        self._send_queued()
        app.settings.session_ready(session)
        app.chat.meter_ready()

    def session_failed(self, message: SessionFailed) -> None:
        if message.ticket == self._ticket:
            self.app.query_one(StatusBar).show("idle", "the conversation could not be opened")
            self.app.notify(message.error, severity="error", timeout=10)

    # ---- a message typed before they are ready

    def ready_to_send(self, text: str | None = None) -> bool:
        """Are the model and the conversation ready for a message? If not, say why. `text` (a message typed
        while the model loads or the conversation opens) is sent by itself once the session is ready, if
        still in the box."""
        app = self.app
        no_model = self.engine is None and app.query_one(StatusBar).phase == "no model"
        if no_model and self.retry_load:
            self._queued_text = text
            self._reload()
            app.notify("Trying the server again" + ("; your message is sent once it answers." if text else "."),
                       severity="warning")
        elif no_model:
            app.notify("No model is loaded; choose one in the settings (Ctrl+O) or with /model NAME.",
                       severity="warning")
        elif self.engine is None or self.session is None:
            self._queued_text = text
            waiting = "The model is still loading" if self.engine is None else "The conversation is still opening"
            app.notify(waiting + ("; your message is sent as soon as it is ready." if text else "."),
                       severity="warning")
        else:
            return True
        return False

    def _send_queued(self) -> None:
        text, self._queued_text = self._queued_text, None
        prompt = self.app.query_one(PromptInput)
        if text and prompt.text.strip() == text and self.app.chat.editing is None:
            prompt.submit()


def _quietly(prepare):
    """`prepare`, its failure left for the first grammar request to report (in one sentence, where it is seen)."""
    def run() -> None:
        try:
            prepare()
        except Exception:
            pass
    return run
