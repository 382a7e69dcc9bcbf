"""`kvchat` with no arguments: the Textual chat app.

The engine loads, reads stored K/V and generates on one engine thread (see
engine_thread.py) and reports through typed messages (engine_events.py); the UI
never blocks on the model. Conversations can be browsed while the model loads:
their history comes from the database, and a conversation takes messages once
its session (and its K/V) is ready on the engine thread.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Static, TextArea

from app.chat.backend import Backend
from app.chat.backend_loader import LoadBackend, chat_session, is_remote
from app.chat.errors import USER_FACING_ERRORS
from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.chat.session import ChatMessage, ChatSession
from app.tui.palette import palette_commands
from app.tui.styles import stylesheet
from app.tui.terminal_signals import resume_only_after_suspend
from app.tui.engine_events import EngineFailed, EngineReady, LoadProgress, SessionFailed, SessionReady
from app.tui.engine_thread import EngineThread
from app.tui.actions.alternatives import AlternativesActions, alternatives_count
from app.tui.actions.commands import CommandActions
from app.tui.actions.context import ContextActions
from app.tui.actions.library import LibraryActions
from app.tui.actions.panels import PanelActions
from app.remote.stream import RemoteError
from app.tui.actions.reply import ReplyActions
from app.tui.actions.thinking import ThinkingActions
from app.chat.config import Config
from app.chat.reply_limits import reply_limits
from app.chat.sampling_settings import SAMPLING_FIELDS, sampling_params
from app.chat.saved_chat import SavedConversation, Storage
from app.tui.widgets.box_notice import BoxNotice
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.key_bar import KeyBar
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.context_meter import conversation_tokens
from app.tui.widgets.status_bar import StatusBar
from engine import EngineError
from storage.errors import StorageError
from storage.preferences import Preferences

STATUS_TICK_S = 0.25  # the status bar is redrawn 4 times a second while a reply is generated
NARROW_BELOW = 100  # columns: narrower, the chat keeps the whole width (see on_resize)
# Closing the terminal window (SIGHUP) or `kill` (SIGTERM) quit like Ctrl+Q: the reply being written is
# stopped and kept, its K/V blocks written; the exit code is 128 + the signal.
QUIT_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]


class KvchatApp(AlternativesActions, ReplyActions, CommandActions, ContextActions, ThinkingActions, PanelActions,
                LibraryActions, App):
    CSS_PATH = str(stylesheet())
    TITLE = "kvchat"
    # In the footer's order: what a newcomer needs first (stop, help, settings) comes first, so that it
    # stays in view on an 80-column terminal.
    BINDINGS = [
        Binding("escape", "escape", "Stop", tooltip="Stop the reply (or an edit); back to the message box"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+o", "settings", "Settings"),
        Binding("ctrl+b", "toggle_sidebar", "Chats"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+t,f2", "toggle_inspector", "Inspector"),
        Binding("ctrl+f", "search", "Search chats", show=False),
        Binding("ctrl+r", "regenerate", "Regenerate", show=False),
        Binding("alt+r,f3", "regenerate_alternatives", "Regenerate N alternatives", show=False,
                tooltip="N alternatives of the last reply at once, each a branch (N: Ctrl+O); a greedy "
                        "conversation's sample at temperature 0.7"),
        Binding("ctrl+g", "edit_last", "Edit last message", show=False),
        Binding("ctrl+s", "export('md')", "Export as Markdown", show=False),
        Binding("ctrl+z", "undo_trash", "Undo moving to the trash (while its notice is up)", show=False,
                priority=True),
        Binding("ctrl+up", "focus_messages", "Go to the messages", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # Before the box's copy and Textual's quit hint: Ctrl+C stops a reply, as in other chat CLIs; with
        # none running it falls through to them (action_interrupt skips).
        Binding("ctrl+c", "interrupt", "Stop the reply", show=False, priority=True),
    ]

    def __init__(self, load_engine: LoadBackend, storage: Storage, overrides: dict | None = None,
                 system: str | None = None, conversation_id: str | None = None, model: str | None = None,
                 engine_thread: EngineThread | None = None, config: Config = Config()):
        """`load_engine(model_spec, progress)`: the embedded engine or a remote server; `overrides`:
        sampling settings given on the command line (they win over a conversation's own, and are not
        stored with it); `conversation_id`: a saved conversation to open; `config`: the config file."""
        super().__init__()
        self._load_engine = load_engine
        self.storage = storage
        self.overrides = {k: v for k, v in (overrides or {}).items() if k in SAMPLING_FIELDS and v is not None}
        self.config = config
        self.system = config.system if system is None else system  # of new conversations
        self.model_spec = model
        self.engine_thread = engine_thread or EngineThread()
        self._owns_engine_thread = engine_thread is None  # a shared one (benchmarks) outlives the app
        self.preferences = Preferences()
        self.alternatives = alternatives_count(self.preferences, config)  # replies "regenerate N" writes
        self.conversation_id = conversation_id  # the conversation shown (None: a new one)
        self.engine: Backend | None = None  # the UI's view of the engine: set when EngineReady arrives
        self._loaded: Backend | None = None  # the engine thread's: set as soon as a load ends
        self.session: ChatSession | None = None  # the shown conversation's, once it is ready
        self._ticket = 0  # which conversation opening the next SessionReady must belong to
        self.reply: AssistantMessageView | None = None
        self._stream = None
        self.editing: int | None = None  # index of the user message being edited
        self.compacting = False  # /compact's summary is being written (actions/context.py)
        self._inspecting_live = True  # the inspector follows the reply being written
        self._queued_text: str | None = None  # typed before the session was ready: sent when it is
        self._retry_load = False  # the last load failed in a way that trying again may fix
        self._format_told: str | None = None  # the chat format notice shown for the loaded model (once)
        self._closing = False
        self._signals: list[int] = []  # installed quit signals

    # ---- layout and lifecycle ------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield Sidebar(self.storage.conversations, id="sidebar")
            with Vertical(id="chat"):
                yield ChatView(id="messages")
                yield Static("", id="editing", markup=False)
                yield PromptInput(history=self._recent_prompts(), id="prompt",
                                  placeholder="Message · Enter sends · Ctrl+J new line · Esc stops the reply")
                yield BoxNotice(id="box-notice")
            yield Inspector(id="inspector")
        yield StatusBar()
        yield KeyBar()

    def _recent_prompts(self) -> list[str]:
        try:
            return self.storage.conversations.recent_prompts()
        except StorageError:
            return []

    async def on_mount(self) -> None:
        theme = self.config.theme or self.preferences.get("theme")  # the config file's, else the last picked
        if theme in self.available_themes:
            self.theme = theme
        self.watch(self, "theme", self._remember_theme, init=False)
        self.query_one(ChatView).alternatives = self._alternatives
        self.query_one(StatusBar).show("loading")
        self.query_one("#prompt").focus()
        self.set_interval(STATUS_TICK_S, self._tick)
        self._catch_quit_signals()
        if self.storage.conversations.read_only_reason:  # browsing works; sending would fail later
            self.notify(self.storage.conversations.read_only_reason, title="Read-only", severity="warning",
                        timeout=30)
        self.engine_thread.submit(lambda: self._load(self.model_spec))
        await self.open_conversation(self.conversation_id)

    def _catch_quit_signals(self) -> None:
        resume_only_after_suspend()  # a closed terminal's SIGCONT must not restart the screen mid-quit
        loop = asyncio.get_running_loop()
        for sig in QUIT_SIGNALS:
            try:
                loop.add_signal_handler(sig, self._quit_on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                continue
            self._signals.append(sig)

    def _quit_on_signal(self, sig: int) -> None:
        if self.return_code is None:
            self.exit(return_code=128 + sig)

    def on_unmount(self) -> None:
        # Quitting mid-reply stops it (kept as stopped); a model still loading finishes loading and then
        # does nothing more. run_tui waits for the engine thread before it closes storage.
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)
        self._closing = True
        if self.session is not None:
            self.session.cancel()
        if self._owns_engine_thread:
            self.engine_thread.stop(timeout=0)

    async def on_event(self, event: events.Event) -> None:
        # Before Textual routes a key (bindings included): typing meant for the message box goes there
        # (PanelActions.key_goes_to_prompt), so a letter typed on a message or the list acts on nothing.
        # While the conversation list covers the chat (narrow terminal), typing goes to its search instead:
        # the message box is hidden under it (LibraryActions.typing_goes_to_list_search).
        if isinstance(event, events.Key) and not event.is_forwarded:
            if not self.typing_goes_to_list_search(event) and self.key_goes_to_prompt(event):
                self.screen.set_focus(self.query_one(PromptInput))
        await super().on_event(event)

    def action_escape(self) -> None:
        """Esc: stop the reply (or cancel the edit), and whatever has the focus, back to the message box;
        the conversation list shown over the chat (narrow terminal) folds away."""
        self.close_list_over_chat()
        self.action_stop()
        self.query_one(PromptInput).focus()

    # Whether the conversation list was shown when the terminal became narrow: widening brings it back,
    # unless the user had hidden it while it was wide.
    _sidebar_was_shown = True

    def on_resize(self, event: events.Resize) -> None:
        """Below NARROW_BELOW columns the chat keeps the whole width: the conversation list folds away
        (Ctrl+B shows it over the chat), and the inspector covers the chat instead of squeezing it."""
        narrow = event.size.width < NARROW_BELOW
        body = self.query_one("#body")
        if narrow == body.has_class("-narrow"):
            return
        body.set_class(narrow, "-narrow")
        sidebar = self.query_one(Sidebar)
        if narrow:
            if self.focused is not None and sidebar in self.focused.ancestors_with_self:
                self.query_one(PromptInput).focus()
            self._sidebar_was_shown, sidebar.display = sidebar.display, False
        elif self._sidebar_was_shown:
            sidebar.display = True

    def tell_at_box(self, sentence: str) -> None:
        """Say why what was just typed was not taken, under the message box (not in a toast, where a later
        notice would hide it); it stays until the box is edited."""
        self.query_one(BoxNotice).say(sentence, self.query_one(PromptInput).text)

    @on(TextArea.Changed, "#prompt")
    def _box_edited(self, event: TextArea.Changed) -> None:
        self.query_one(BoxNotice).box_changed(event.text_area.text)
        self._undoable_trash = None  # typed since the trash notice: Ctrl+Z is the box's undo again

    def _remember_theme(self, theme: str) -> None:
        try:
            self.preferences.set("theme", theme)
        except OSError as exc:
            self.notify(f"The theme could not be saved ({exc.strerror or exc}).", severity="warning")

    def _tick(self) -> None:
        if self.generating:
            self.query_one(StatusBar).refresh_text()

    def get_system_commands(self, screen):
        yield from palette_commands(self, super().get_system_commands(screen))

    # ---- the engine and the conversation's session ------------------------------------------

    @property
    def generating(self) -> bool:
        """A reply is being written, or /compact's summary: the conversation takes no other message now."""
        return self.reply is not None or self.compacting

    def _load(self, spec: str | None) -> None:
        """Engine thread: load the model (replacing any loaded one)."""
        self._loaded = None
        try:
            engine = self._load_engine(spec, lambda step: self.post_message(LoadProgress(step)))
        except EngineError as exc:
            self.post_message(EngineFailed(str(exc), retry=isinstance(exc, RemoteError)))
            return
        if not self._closing:
            self._loaded = engine
            self.post_message(EngineReady(engine))

    def _open_session(self, ticket: int, conversation_id: str | None) -> None:
        """Engine thread: the ChatSession of a conversation (restoring its K/V), or of a new one."""
        engine = self._loaded
        if engine is None or self._closing or ticket != self._ticket:
            return  # no model (already reported), quitting, or another conversation was opened since
        try:
            overrides = argparse.Namespace(**self.overrides)
            if conversation_id is None:  # it keeps no settings of its own until the user sets some
                saved = SavedConversation.new(self.storage, engine, self.system,
                                              sampling_params(overrides, None, self.config), settings={})
            else:
                saved = SavedConversation.open(self.storage, conversation_id)
            conversation = saved.conversation
            system = conversation.system if conversation else self.system
            params = sampling_params(overrides, conversation.params if conversation else None, self.config)
            session = chat_session(engine, system, params, saved, reply_limits(self.config))
        except USER_FACING_ERRORS as exc:
            self.post_message(SessionFailed(ticket, str(exc)))
            return
        self.post_message(SessionReady(ticket, session))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one(StatusBar).show("loading", message.step)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.engine = engine = message.engine
        info = engine.info
        bar = self.query_one(StatusBar)
        bar.context_window = info.context_window
        bar.model, bar.device = info.model_name, f"{info.device} {info.dtype}".strip()
        bar.kv_cache = engine.cache_stats()
        bar.clear_reply()  # a reply's numbers from the model loaded before are not this one's
        self._format_told = None  # a new model: its chat format (if it has no template) is told again
        prompt = self.query_one(PromptInput)
        window = info.context_window or None  # a server may not say
        prompt.context_window, prompt.max_chars = window, window and MAX_CHARS_PER_TOKEN * window
        bar.show("idle", f"{'connected' if is_remote(engine) else 'loaded'} in {info.load_ms / 1e3:.1f} s")

    def on_engine_failed(self, message: EngineFailed) -> None:
        self._retry_load = message.retry
        self.query_one(StatusBar).show("no model", message.error)
        title = "The server could not be used" if message.retry else "The model could not be loaded"
        self.notify(message.error, title=title, severity="error", timeout=30)

    def _reload(self) -> None:
        """Load self.model_spec again (a new model, or a server that may be up now), then open the
        conversation shown with it."""
        self._retry_load = False
        self.query_one(StatusBar).show("loading", "")
        ticket, target = self._ticket, self.conversation_id
        self.engine_thread.submit(lambda: self._load(self.model_spec))
        self.engine_thread.submit(lambda: self._open_session(ticket, target))

    async def open_conversation(self, conversation_id: str | None) -> None:
        """Show a saved conversation (None: a new one) at once; it takes messages when its session is ready."""
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        store = self.storage.conversations
        try:
            conversation = store.get(conversation_id) if conversation_id else None
            branch = store.branch(conversation.id) if conversation else []
        except StorageError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            conversation, branch = None, []
        self._ticket += 1
        self._queued_text = None  # it was meant for the conversation shown before
        self.query_one(StatusBar).clear_reply()  # the last reply's numbers were the other conversation's
        self.session, self.conversation_id = None, conversation.id if conversation else None
        self._stop_editing()
        await self.query_one(ChatView).show(
            [ChatMessage(m.role, m.text, 0, m.id, m.status, m.stats) for m in branch])
        self.query_one(Sidebar).highlight(self.conversation_id)
        self.query_one(Inspector).show(None)
        if self._loaded is not None or self.engine is not None:
            self.query_one(StatusBar).show("opening", "restoring the KV cache" if conversation else "")
        ticket, target = self._ticket, self.conversation_id
        self.engine_thread.submit(lambda: self._open_session(ticket, target))

    def on_session_ready(self, message: SessionReady) -> None:
        if message.ticket != self._ticket:
            return
        session = self.session = message.session
        if session.notice:
            self.notify(session.notice, severity="warning", timeout=10)
        conversation = session.saved.conversation if session.saved else None
        bar = self.query_one(StatusBar)
        # A model without a chat template: which format kvchat writes it in, said once (not again for each
        # conversation opened in the same one); the inspector names it with each reply.
        told = session.format_notice
        if told and told != self._format_told:
            self._format_told = told
            self.notify(told, title="No chat template", timeout=10)
        if conversation and self.engine and conversation.model != self.engine.info.model_name:
            self.notify(f"This conversation was made with {conversation.model}; replies now come from "
                        f"{self.engine.info.model_name}.", timeout=10)
        replies = [m for m in session.messages if m.role == "assistant"]
        bar.context_used = conversation_tokens(session.seen_ids, replies[-1].stats if replies else None)
        bar.show("idle", session.chat_format.short if session.chat_format else "")
        self._send_queued()

    def on_session_failed(self, message: SessionFailed) -> None:
        if message.ticket == self._ticket:
            self.query_one(StatusBar).show("idle", "the conversation could not be opened")
            self.notify(message.error, severity="error", timeout=10)

    def _can_send(self, text: str | None = None) -> bool:
        """Can a message be sent now? If not, say why. `text` (a message typed while the model loads
        or the conversation opens) is sent by itself once the session is ready, if still in the box."""
        no_model = self.engine is None and self.query_one(StatusBar).phase == "no model"
        if self.compacting:
            self.notify("The conversation is being compacted; press Esc to stop it.", severity="warning")
        elif self.generating:
            self.notify("A reply is still being written; press Esc to stop it.", severity="warning")
        elif no_model and self._retry_load:
            self._queued_text = text
            self._reload()
            self.notify("Trying the server again" + ("; your message is sent once it answers." if text else "."),
                        severity="warning")
        elif no_model:
            self.notify("No model is loaded; choose one in the settings (Ctrl+O) or with /model NAME.",
                        severity="warning")
        elif self.engine is None or self.session is None:
            self._queued_text = text
            waiting = "The model is still loading" if self.engine is None else "The conversation is still opening"
            self.notify(waiting + ("; your message is sent as soon as it is ready." if text else "."),
                        severity="warning")
        else:
            return True
        return False

    def _send_queued(self) -> None:
        text, self._queued_text = self._queued_text, None
        prompt = self.query_one(PromptInput)
        if text and prompt.text.strip() == text and self.editing is None:
            prompt.submit()

    def _alternatives(self, message: ChatMessage) -> list[str]:
        try:
            return self.storage.conversations.sibling_ids(message.id)
        except StorageError:
            return []

