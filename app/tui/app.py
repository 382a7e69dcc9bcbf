"""`kvchat` with no arguments: the Textual chat app.

The engine loads, reads stored K/V and generates on one engine thread (see
engine_thread.py) and reports through typed messages (engine_events.py); the UI
never blocks on the model. Conversations can be browsed while the model loads:
their history comes from the database, and a conversation takes messages once
its session (and its K/V) is ready on the engine thread (model_session.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from textual import events, on
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import TextArea

from app.chat.backend import Backend
from app.chat.backend_loader import LoadBackend
from app.chat.session import ChatMessage, ChatSession
from app.chat.tool_loop import DEFAULT_MAX_ROUNDS
from app.tools.toolbox import ToolBox
from app.tui.palette import palette_commands
from app.tui.styles import stylesheet
from app.tui.terminal_signals import QuitSignals
from app.tui.engine_events import EngineFailed, EngineReady, LoadProgress, SessionFailed, SessionReady
from app.tui.engine_thread import EngineThread
from app.tui.model_session import ModelSession
from app.tui.chat.alternatives import alternatives_count
from app.tui.chat.pane import ChatPane
from app.tui.chat.settings import ConversationSettings
from app.tui.library import Library
from app.tui.navigation import Navigation
from app.chat.config import Config
from app.chat.sampling_settings import SAMPLING_FIELDS
from app.chat.saved.conversation import Storage
from app.tui.screens.help import chat_help
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.key_bar import KeyBar
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status_bar import StatusBar
from storage.errors import StorageError
from storage.preferences import Preferences

STATUS_TICK_S = 0.25  # the status bar is redrawn 4 times a second while a reply is generated
NARROW_BELOW = 100  # columns: narrower, the chat keeps the whole width (see on_resize)


class KvchatApp(App):
    """The chat screen: the conversation list (Library), the chat pane (ChatPane, which owns the reply being
    written) and the inspector. The app shows a conversation and routes the keys; each concern is an object
    it composes: the model and the shown conversation's session (ModelSession), the settings, the library
    and navigation."""

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
                 engine_thread: EngineThread | None = None, config: Config = Config(),
                 tools: ToolBox | None = None, tool_allow: Sequence[str] = (), tool_rounds: int = DEFAULT_MAX_ROUNDS):
        """`load_engine(model_spec, progress)`: the embedded engine or a remote server; `overrides`:
        sampling settings given on the command line (they win over a conversation's own, and are not
        stored with it); `conversation_id`: a saved conversation to open; `config`: the config file.
        `tools`: the tools the model may call (MCP servers' tools; None: none), `tool_allow` the globs of
        those that run without asking ("server.tool"), `tool_rounds` a message's replies at most."""
        super().__init__()
        self.tools = tools  # read at each message: may be set after the app is made, before it runs
        self.tool_allow = tuple(tool_allow)
        self.tool_rounds = tool_rounds
        self.storage = storage
        self.overrides = {k: v for k, v in (overrides or {}).items() if k in SAMPLING_FIELDS and v is not None}
        self.config = config
        self.system = config.system if system is None else system  # of new conversations
        self.engine_thread = engine_thread or EngineThread()
        self._owns_engine_thread = engine_thread is None  # a shared one (benchmarks) outlives the app
        self.preferences = Preferences()
        self.alternatives = alternatives_count(self.preferences, config)  # replies "regenerate N" writes
        self.conversation_id = conversation_id  # the conversation shown (None: a new one)
        self.model_session = ModelSession(self, load_engine, model)  # the engine and the shown one's session
        self._signals = QuitSignals(self._quit_on_signal)  # closing the terminal, or `kill`, quits as Ctrl+Q
        self.chat = ChatPane(self, self._recent_prompts, id="chat")  # owns the reply being written
        self.settings = ConversationSettings(self)
        self.library = Library(self)
        self.navigation = Navigation(self)

    # ---- layout and lifecycle ------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield Sidebar(self.storage.conversations, id="sidebar")
            yield self.chat
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
        self.query_one(StatusBar).show("loading")
        self.query_one("#prompt").focus()
        self.set_interval(STATUS_TICK_S, self._tick)
        self._signals.catch()
        if self.storage.conversations.read_only_reason:  # browsing works; sending would fail later
            self.notify(self.storage.conversations.read_only_reason, title="Read-only", severity="warning",
                        timeout=30)
        self.model_session.start()
        await self.open_conversation(self.conversation_id)

    def _quit_on_signal(self, sig: int) -> None:
        if self.return_code is None:
            self.exit(return_code=128 + sig)

    def on_unmount(self) -> None:
        # run_tui waits for the engine thread before it closes storage.
        self._signals.release()
        self.chat.tool_use.close()  # a call waiting for an answer is refused: the engine thread waits on nothing
        self.model_session.close()
        if self._owns_engine_thread:
            self.engine_thread.stop(timeout=0)

    async def on_event(self, event: events.Event) -> None:
        # Before Textual routes a key (bindings included): typing meant for the message box goes there
        # (Navigation.key_goes_to_prompt), so a letter typed on a message or the list acts on nothing.
        # While the conversation list covers the chat (narrow terminal), typing goes to its search instead:
        # the message box is hidden under it (Library.typing_goes_to_list_search).
        if isinstance(event, events.Key) and not event.is_forwarded:
            if not self.library.typing_goes_to_list_search(event) and self.navigation.key_goes_to_prompt(event):
                self.screen.set_focus(self.query_one(PromptInput))
        await super().on_event(event)

    def action_escape(self) -> None:
        """Esc: stop the reply (or cancel the edit), and whatever has the focus, back to the message box;
        the conversation list shown over the chat (narrow terminal) folds away."""
        self.library.close_list_over_chat()
        self.chat.stop()
        self.query_one(PromptInput).focus()

    def on_resize(self, event: events.Resize) -> None:
        """Below NARROW_BELOW columns the chat keeps the whole width: the conversation list folds away
        (Ctrl+B shows it over the chat), and the inspector covers the chat instead of squeezing it."""
        narrow = event.size.width < NARROW_BELOW
        body = self.query_one("#body")
        if narrow != body.has_class("-narrow"):
            body.set_class(narrow, "-narrow")
            self.library.fold(narrow)

    @on(TextArea.Changed, "#prompt")
    def _box_edited(self, event: TextArea.Changed) -> None:
        self.library.box_edited()  # typed since the trash notice: Ctrl+Z is the box's undo again

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
        return self.chat.generating

    @property
    def engine(self) -> Backend | None:
        return self.model_session.engine

    @property
    def session(self) -> ChatSession | None:
        return self.model_session.session

    # The engine thread's news of the model and the session, for ModelSession:
    def on_load_progress(self, message: LoadProgress) -> None:
        self.model_session.load_progress(message)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.model_session.engine_ready(message)

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.model_session.engine_failed(message)

    def on_session_ready(self, message: SessionReady) -> None:
        self.model_session.session_ready(message)

    def on_session_failed(self, message: SessionFailed) -> None:
        self.model_session.session_failed(message)

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
        self.model_session.leave()
        self.query_one(StatusBar).clear_reply()  # the last reply's numbers were the other conversation's
        self.conversation_id = conversation.id if conversation else None
        self.chat.branches.stop_editing()
        await self.query_one(ChatView).show(
            [ChatMessage(m.role, m.text, 0, m.id, m.status, m.stats, m.tools) for m in branch])
        self.query_one(Sidebar).highlight(self.conversation_id)
        self.query_one(Inspector).show(None)
        self.model_session.open(restoring=conversation is not None)

    async def conversation_saved(self) -> None:
        """The sidebar lists the conversation as it now is (the first message created it)."""
        session = self.session
        if session and session.saved and session.saved.id != self.conversation_id:
            self.conversation_id = session.saved.id
        sidebar = self.query_one(Sidebar)
        await sidebar.refresh_list()
        sidebar.highlight(self.conversation_id)

    def alternatives_of(self, message: ChatMessage) -> list[str]:
        """The ids of `message`'s versions (its branches), in order (‹ › on it)."""
        try:
            return self.storage.conversations.sibling_ids(message.id)
        except StorageError:
            return []

    # ---- the keys: the app's bindings, carried out by the object each is about

    def letters_act(self, widget) -> bool:
        return self.navigation.letters_act(widget)  # asked by widgets/letter_keys.py

    def on_descendant_focus(self, event) -> None:
        if isinstance(event.widget, AssistantMessageView) and self.query_one(Inspector).display:
            self.chat.inspect(event.widget)
        self.navigation.focus_moved()

    def action_focus_messages(self) -> None:
        self.navigation.focus_messages()

    def action_interrupt(self) -> None:
        """Ctrl+C: stop the reply (or the compacting) as Esc does; otherwise the key copies or hints at Ctrl+Q."""
        if not self.chat.interrupting():
            raise SkipAction()

    def action_stop(self) -> None:
        self.chat.stop()

    async def action_regenerate(self) -> None:
        await self.chat.branches.regenerate()

    async def action_regenerate_alternatives(self) -> None:
        await self.chat.alternatives_writer.start()

    def action_edit_last(self) -> None:
        self.chat.branches.edit_last()

    def action_settings(self) -> None:
        self.settings.open()

    def action_toggle_inspector(self) -> None:
        inspector = self.query_one(Inspector)
        inspector.display = not inspector.display
        if inspector.display:
            focused = self.focused
            self.chat.inspect(focused if isinstance(focused, AssistantMessageView) else
                              self.query_one(ChatView).last_reply())

    def action_help(self) -> None:
        self.push_screen(chat_help(self.BINDINGS))

    def action_tools(self) -> None:
        self.chat.tool_use.choose()

    # ---- the conversation list's requests and keys (Library)

    async def on_sidebar_open(self, event: Sidebar.Open) -> None:
        await self.library.open(event.conversation_id)

    async def on_sidebar_new(self, event: Sidebar.New) -> None:
        await self.action_new_chat()

    def on_sidebar_rename(self, event: Sidebar.Rename) -> None:
        self.library.rename(event.conversation_id)

    def on_sidebar_delete(self, event: Sidebar.Delete) -> None:
        self.library.delete(event.conversation_id)

    async def on_sidebar_restore(self, event: Sidebar.Restore) -> None:
        await self.library.restore(event.conversation_id)

    async def on_app_focus(self) -> None:
        await self.library.check_for_changes()

    async def action_new_chat(self) -> None:
        await self.library.new_chat()

    async def action_toggle_sidebar(self) -> None:
        await self.library.toggle_sidebar()

    def action_search(self) -> None:
        self.library.search()

    async def action_undo_trash(self) -> None:
        await self.library.undo_trash()

    async def action_show_trash(self) -> None:
        await self.library.show_trash()

    def action_export(self, fmt: str) -> None:
        self.library.export(fmt)

    def action_copy_reply(self) -> None:
        self.library.copy_reply()

    def action_copy_code(self) -> None:
        self.library.copy_code()
