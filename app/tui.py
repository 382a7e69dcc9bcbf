"""`kvchat` with no arguments: the Textual chat screen.

The engine loads and generates on one engine thread (see engine_thread.py); the UI only receives small
messages (text batches, stats, done) and never blocks on the model.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Input

from app.chat import ChatSession
from app.engine_thread import EngineThread
from app.options import engine_options, sampling_params
from app.saved_chat import SavedConversation, Storage
from app.widgets.messages import AssistantMessage, UserMessage
from app.widgets.status_bar import StatusBar
from engine import Done, Engine, EngineError, RequestStats, SamplingParams, Stats, TokenDelta
from storage.db import StorageError

STYLES = Path(__file__).resolve().parent.parent / "assets" / "kvchat.tcss"
TEXT_BATCH_S = 0.05  # streamed text reaches the UI at most 20 times a second


class EngineReady(Message):
    def __init__(self, engine: Engine, session: ChatSession):
        super().__init__()
        self.engine = engine
        self.session = session


class EngineFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class LoadProgress(Message):
    def __init__(self, step: str):
        super().__init__()
        self.step = step


class ReplyText(Message):
    def __init__(self, text: str):
        super().__init__()
        self.text = text


class ReplyStats(Message):
    def __init__(self, stats: RequestStats):
        super().__init__()
        self.stats = stats


class ReplyDone(Message):
    def __init__(self, done: Done | None, error: str | None = None, kv_cache: dict | None = None):
        super().__init__()
        self.done = done
        self.error = error
        self.kv_cache = kv_cache or {}


class KvchatApp(App):
    CSS_PATH = str(STYLES)
    TITLE = "kvchat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, load_engine: Callable[[Callable[[str], None]], Engine],
                 params: SamplingParams = SamplingParams(), system: str | None = None,
                 storage: Storage | None = None, conversation_id: str | None = None):
        """`storage`: where chats are saved (None: nothing is saved); `conversation_id`: a saved one to resume."""
        super().__init__()
        self._load_engine = load_engine
        self.params = params
        self.system = system
        self.storage = storage
        self.conversation_id = conversation_id
        self.engine_thread = EngineThread()
        self._closing = False
        self.engine: Engine | None = None
        self.session: ChatSession | None = None
        self.reply: AssistantMessage | None = None
        self._stream = None

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="messages")
        yield Input(placeholder="Message · Enter sends · Esc stops the reply", id="prompt")
        yield StatusBar()
        yield Footer()

    def on_unmount(self) -> None:
        # Quitting mid-reply stops it (kept as stopped); a model still loading finishes loading and then
        # does nothing more. run_tui waits for the engine thread before it closes storage.
        self._closing = True
        if self.session is not None:
            self.session.cancel()
        self.engine_thread.stop(timeout=0)

    def on_mount(self) -> None:
        self.query_one("#messages", VerticalScroll).anchor()
        self.query_one(StatusBar).show("loading")
        self.query_one("#prompt", Input).focus()
        self.load()

    @property
    def generating(self) -> bool:
        return self.reply is not None

    def _new_session(self, engine: Engine) -> ChatSession:
        saved = SavedConversation.new(self.storage, engine, self.system, self.params) if self.storage else None
        return ChatSession(engine, self.system, self.params, saved)

    def load(self) -> None:
        self.engine_thread.submit(self._load)

    def _load(self) -> None:
        try:
            engine = self._load_engine(lambda step: self.post_message(LoadProgress(step)))
            if self._closing:
                return
            if self.conversation_id and self.storage:
                self.post_message(LoadProgress("loading the conversation and its KV cache"))
                saved = SavedConversation.open(self.storage, self.conversation_id)
                params = sampling_params(argparse.Namespace(), saved.conversation.params)
                session = ChatSession(engine, saved.conversation.system, params, saved)
            else:
                session = self._new_session(engine)
        except (EngineError, StorageError) as exc:
            self.post_message(EngineFailed(str(exc)))
            return
        self.post_message(EngineReady(engine, session))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.query_one(StatusBar).show("loading", message.step)

    async def on_engine_ready(self, message: EngineReady) -> None:
        session = message.session
        await self.query_one("#messages", VerticalScroll).mount_all(
            [UserMessage(m.content) if m.role == "user" else AssistantMessage(m.content) for m in session.messages])
        if session.notice:
            self.notify(session.notice, severity="warning", timeout=10)
        # Ready only now: a message sent earlier would be shown above the resumed history.
        self.engine, self.session = message.engine, session
        bar = self.query_one(StatusBar)
        info = self.engine.info
        bar.context_window = info.context_window
        bar.device = f"{info.model_name} · {info.device} {info.dtype}"
        bar.kv_cache = self.engine.cache_stats()
        bar.show("idle", f"loaded in {info.load_ms / 1e3:.1f} s")

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.query_one(StatusBar).show("no model", message.error)
        self.notify(message.error, title="The model could not be loaded", severity="error", timeout=30)

    @on(Input.Submitted, "#prompt")
    async def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.session is None:
            self.notify("The model is still loading.", severity="warning")
            return
        if self.generating:
            self.notify("A reply is still being written; press Esc to stop it.", severity="warning")
            return
        try:
            events = self.session.send(text)
        except (EngineError, StorageError, ValueError) as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        event.input.value = ""
        messages = self.query_one("#messages", VerticalScroll)
        self.reply = AssistantMessage()
        await messages.mount_all([UserMessage(text), self.reply])
        self._stream = AssistantMessage.get_stream(self.reply)
        self.query_one(StatusBar).show("prefill")
        self.engine_thread.submit(lambda: self._stream_reply(events))

    def _stream_reply(self, events) -> None:
        """On the engine thread: run the reply, posting its text in batches, its stats and its end."""
        pending: list[str] = []
        done = None
        last_post = time.monotonic()
        try:
            for event in events:
                if isinstance(event, TokenDelta):
                    pending.append(event.text)
                    if time.monotonic() - last_post >= TEXT_BATCH_S:
                        self.post_message(ReplyText("".join(pending)))
                        pending.clear()
                        last_post = time.monotonic()
                elif isinstance(event, Stats):
                    self.post_message(ReplyStats(event.stats))
                elif isinstance(event, Done):
                    if pending:
                        self.post_message(ReplyText("".join(pending)))
                    done = event
            # After the stream: the request's blocks are back in the cache and the stats include them.
            self.post_message(ReplyDone(done, kv_cache=self.engine.cache_stats()))
        except (EngineError, StorageError) as exc:
            self.post_message(ReplyDone(None, str(exc)))
        except Exception as exc:  # a bug must not take the chat (and the user's text) down with it
            self.post_message(ReplyDone(None, f"The reply failed unexpectedly ({exc!r})."))

    async def on_reply_text(self, message: ReplyText) -> None:
        if self._stream is not None:
            await self._stream.write(message.text)

    def on_reply_stats(self, message: ReplyStats) -> None:
        self.query_one(StatusBar).show(message.stats.phase, stats=message.stats)

    async def on_reply_done(self, message: ReplyDone) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        reply, self.reply = self.reply, None
        bar = self.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        if message.done is None:
            bar.show("idle", "failed")
            self.notify(message.error or "The reply failed.", severity="error", timeout=10)
            return
        # One full render at the end, so streamed code fences never stay half-drawn.
        if reply is not None:
            await reply.update(message.done.text or "*(no reply)*")
        reason = {"stop": "", "length": "stopped at the length limit", "stopped": "stopped by you"}
        bar.show("idle", reason.get(message.done.finish_reason, message.done.finish_reason), message.done.stats)

    def action_stop(self) -> None:
        if self.session is not None:
            self.session.cancel()

    async def action_new_chat(self) -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        if self.engine is not None:
            self.session = self._new_session(self.engine)
        await self.query_one("#messages", VerticalScroll).remove_children()
        self.query_one(StatusBar).show("idle", "new chat")


def run_tui(args: argparse.Namespace) -> int:
    options = engine_options(args)
    params = sampling_params(args)
    storage = Storage.open(args.snapshot_gb)
    try:
        app = KvchatApp(lambda progress: Engine.load(options, progress=progress), params, storage=storage,
                        conversation_id=args.conversation)
        app.run()
        app.engine_thread.stop()  # the reply it stopped, or the model it was loading, ends first
    finally:
        storage.close()  # pending KV snapshots are written before the process ends
    return 0
