"""Regenerate N in the chat: N alternatives of the last reply written at once, browsed as they grow.
AlternativesWriter is the chat pane's (pane.py), which hands it the engine's events and ‹ › on the view
being written; the chat logic is ChatSession.regenerate_alternatives' (app/chat/reply/alternatives.py).

One message view shows one alternative at a time, streaming: ‹ › on it shows another, with what that
one has written so far, streaming on from there; the others are written in the background meanwhile.
The status bar shows their tokens/s together and each one's. Esc stops them all, and each keeps what it
wrote. When they have ended the conversation shows the alternative on screen, and ‹ › browses the
reply's branches as on any message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual.widgets import Markdown

from app.chat.reply.alternatives import GREEDY_STANDIN_TEMPERATURE, AlternativeReplies
from app.chat.alternatives_count import DEFAULT_ALTERNATIVES, alternatives_problem
from app.chat.prompt.thinking import ThinkingDelta, ThinkingSplitter
from app.chat.backend_loader import is_remote
from app.chat.chat_message import ChatMessage
from app.chat.errors import USER_FACING_ERRORS
from app.chat.reply.stats import ReplyNumbers
from app.chat.saved.conversation import ConversationChanged
from app.chat.wording import counted
from app.tui.alternative_events import AlternativeEnded, AlternativesDone, AlternativesProgress, stream_alternatives
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView, MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar
from engine import RequestStats

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.session import ChatSession
    from app.tui.engine_thread import EngineThread
    from storage.preferences import Preferences

PREFERENCE = "alternatives"  # the settings screen's choice, kept in the preferences file


def alternatives_count(preferences: Preferences, config: Config) -> int:
    """How many alternatives to write: the settings screen's last choice, else the config file's, else
    the default (a preference out of bounds, from a damaged file, is passed over)."""
    chosen = preferences.get(PREFERENCE)
    if alternatives_problem(chosen) is None:
        return chosen
    return config.alternatives or DEFAULT_ALTERNATIVES


def start_note(count: int, greedy: bool, remote: bool) -> str:
    """What the user is told as the alternatives start."""
    note = f"Writing {count} alternatives of the reply: ‹ › on it shows another as they grow; Esc stops them all."
    if greedy:
        note += (f" This conversation is greedy (temperature 0), which would write {count} copies of one reply, "
                 f"so they sample at temperature {GREEDY_STANDIN_TEMPERATURE:g}.")
    if remote:
        note += " The server writes them one after another."
    return note


@dataclass
class LiveAlternatives:
    """The UI's side of the alternatives being written: what each has written and its numbers."""

    replies: AlternativeReplies
    texts: list[str] = field(default_factory=list)
    stats: list[RequestStats | None] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    kept: list[ChatMessage | None] = field(default_factory=list)  # what each ended as (None: nothing)
    stream: MarkdownStream | None = None  # the shown one's answer, streamed into the view
    opens_thinking: bool = False  # their prompt ends inside an open <think> (app/chat/prompt/thinking.py)
    # Each one's text split as it comes: its answer (what the Markdown shows) and its reasoning, apart.
    splitters: list[ThinkingSplitter] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    reasonings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        count = self.replies.count
        self.texts, self.stats, self.ended, self.kept = [""] * count, [None] * count, [False] * count, [None] * count
        self.splitters = [ThinkingSplitter(self.opens_thinking) for _ in range(count)]
        self.answers, self.reasonings = [""] * count, [""] * count

    def add(self, index: int, text: str) -> ThinkingDelta:
        """What alternative `index` wrote since the last batch, split."""
        self.texts[index] += text
        delta = self.splitters[index].push(text)
        self.answers[index] += delta.answer
        self.reasonings[index] += delta.thinking
        return delta

    @property
    def shown(self) -> int:
        return self.replies.shown

    def writing(self) -> int:
        return self.ended.count(False)


@runtime_checkable  # so a test can check that the chat pane keeps it
class AlternativesPane(Protocol):
    """What AlternativesWriter uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: AlternativesHost  # the app
    reply: AssistantMessageView | None  # the view they are written in, while they are
    inspecting_live: bool  # the inspector follows the reply being written

    def writing(self, view: AssistantMessageView | None) -> None: ...

    def can_send(self, text: str | None = None) -> bool: ...

    async def reload_changed(self) -> None: ...

    async def reply_ended(self, clean: bool) -> None: ...

    async def show_final(self, reply: AssistantMessageView, message: ChatMessage) -> None: ...

    def inspect(self, view: AssistantMessageView | None) -> None: ...


class AlternativesHost(Protocol):
    """What AlternativesWriter uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None
    engine: Backend | None
    engine_thread: EngineThread
    config: Config
    alternatives: int  # how many to write (alternatives_count)

    async def conversation_saved(self) -> None: ...


class AlternativesWriter:
    """The alternatives being written, if any, and what the chat does with their events (the pane's)."""

    def __init__(self, pane: AlternativesPane):
        self.pane = pane
        self.live: LiveAlternatives | None = None  # the alternatives being written, if any

    async def start(self) -> None:
        """Alt+R: write the N alternatives of the last reply."""
        pane, host = self.pane, self.pane.host
        if not pane.can_send():
            return
        session, count = host.session, host.alternatives
        try:
            replies = session.regenerate_alternatives(count)
        except ConversationChanged:
            await pane.reload_changed()
            return
        except (*USER_FACING_ERRORS, ValueError) as exc:
            pane.notify(str(exc), severity="warning", timeout=10)
            return
        chat = pane.query_one(ChatView)
        await chat.truncate(len(session.messages))
        view = await chat.add(ChatMessage("assistant", "", status="streaming"))
        if view is None:  # quitting
            replies.cancel()
            return
        view.choice = (0, count)
        view.refresh_header()
        self.live = LiveAlternatives(replies, opens_thinking=session.opens_thinking)
        pane.writing(view)
        view.thinking.begin(expanded=not host.config.collapse_thinking)
        self.live.stream = Markdown.get_stream(view.body)
        pane.app.query_one(StatusBar).begin_reply(replies.rates())
        pane.notify(start_note(count, session.params.greedy, is_remote(host.engine)), timeout=8)
        engine = host.engine
        host.engine_thread.submit(lambda: stream_alternatives(replies, engine, pane.post_message))

    async def browse(self, event: MessageView.BranchRequested) -> bool:
        """‹ › on the view being written shows another alternative: True when it was that (and done)."""
        live = self.live
        if live is None or event.view is not self.pane.reply:
            return False
        position = live.shown + event.step
        if not 0 <= position < live.replies.count:
            self.pane.notify("There is no other alternative that way.", timeout=3)
            return True
        live.replies.shown = position  # also the one the conversation shows when they end
        await self._show_alternative(position)
        self._show_live_numbers()
        return True

    async def _show_alternative(self, index: int) -> None:
        """The view shows alternative `index`: what it wrote, streaming on if it is still being written."""
        live, view = self.live, self.pane.reply
        if live.stream is not None:
            await live.stream.stop()
            live.stream = None
        if live.ended[index]:
            view.message = live.kept[index] or ChatMessage("assistant", "", status="stopped")
            parts = view.parts
            view.thinking.finish(parts.thinking, None, parts.thinking_ended)
            await view.body.update(parts.answer or ("*(no answer)*" if parts.thinking else
                                                    "*(stopped before it wrote anything)*"))
        else:
            view.message = ChatMessage("assistant", live.texts[index], status="streaming")
            view.thinking.reasoning = ""
            view.thinking.add(live.reasonings[index])
            await view.body.update(live.answers[index])
            live.stream = Markdown.get_stream(view.body)
        view.choice = (index, live.replies.count)
        view.refresh_header()

    async def progress(self, message: AlternativesProgress) -> None:
        live = self.live
        if live is None:
            return
        deltas = {index: live.add(index, text) for index, text in message.texts.items()}
        for index, stats in message.stats.items():
            live.stats[index] = stats
        bar = self.pane.app.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.streams = message.rates
        shown = deltas.get(live.shown)
        if shown is not None and shown.thinking:
            self.pane.reply.thinking.add(shown.thinking)
        if shown is not None and shown.answer and live.stream is not None:
            await live.stream.write(shown.answer)
        self._show_live_numbers()

    async def ended(self, message: AlternativeEnded) -> None:
        live = self.live
        if live is None:
            return
        live.ended[message.index], live.kept[message.index] = True, message.message
        if message.stats is not None:
            live.stats[message.index] = message.stats
        if message.index == live.shown:
            await self._show_alternative(message.index)  # one full render, as a single reply's end
        self._show_live_numbers()

    def _show_live_numbers(self) -> None:
        """The status bar (and a live inspector) show the alternative on screen and all their rates."""
        live, bar = self.live, self.pane.app.query_one(StatusBar)
        stats = live.stats[live.shown]
        writing = f"{live.writing()} of {live.replies.count} alternatives being written"
        if stats is None:
            bar.show(bar.phase, writing)
            return
        bar.show("decode" if live.ended[live.shown] else stats.phase, writing, stats)
        inspector = self.pane.app.query_one(Inspector)
        if inspector.display and self.pane.inspecting_live:
            inspector.show(ReplyNumbers.from_request(stats), f"alternative {live.shown + 1} being written")

    async def done(self, message: AlternativesDone) -> None:
        # The pane's reply is cleared only when the screen is final, so "generating" covers all of this.
        try:
            await self._show_alternatives_end(message)
        finally:
            self.pane.writing(None)
            self.live = None
            self.pane.query_one(PromptInput).refresh_meter()  # the reply took room in the context window
        await self.pane.reply_ended(message.adopted is not None)  # the message queued meanwhile

    async def _show_alternatives_end(self, message: AlternativesDone) -> None:
        pane = self.pane
        live, view, session = self.live, pane.reply, pane.host.session
        if live is None or view is None or session is None:
            return
        if live.stream is not None:
            await live.stream.stop()
            live.stream = None
        bar, count = pane.app.query_one(StatusBar), live.replies.count
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.streams = message.rates or bar.streams
        if message.errors:
            many = len(message.errors) > 1
            failed = f"{len(message.errors)} of the {count} alternatives" if many else "An alternative"
            pane.notify(f"{failed} could not be written whole: {message.errors[0]}", severity="error", timeout=10)
        adopted = message.adopted
        if adopted is None:  # none kept: the conversation is as it was
            await pane.query_one(ChatView).show(session.messages)
            bar.show("idle", "no alternative was kept")
            return
        shown = live.kept[live.shown]
        if live.shown != adopted and shown is not None and shown.id is not None:  # browsed as they ended
            try:
                session.switch_branch(shown.id)
                adopted = live.shown
            except USER_FACING_ERRORS as exc:
                pane.notify(str(exc), severity="error", timeout=10)
        view.choice = None
        await pane.show_final(view, session.messages[-1])
        kept = sum(reply is not None for reply in live.kept)
        bar.show("idle", f"{counted(kept, 'alternative')} written", live.stats[adopted])
        await pane.host.conversation_saved()
        pane.writing(None)  # so the inspector shows the reply on screen, not "the reply being written"
        pane.inspect(view)
