"""Regenerate N in the chat: N alternatives of the last reply written at once, browsed as they grow.
A mixin of KvchatApp, ahead of ReplyActions (whose ‹ › handler it takes over while they are written);
the chat logic is ChatSession.regenerate_alternatives' (app/chat/alternatives.py).

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
    from textual.app import App
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
    opens_thinking: bool = False  # their prompt ends inside an open <think> (app/chat/thinking.py)
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


@runtime_checkable  # so a test can check that KvchatApp keeps it
class AlternativesHost(Protocol):
    """What AlternativesActions uses of the app it is mixed into, besides Textual's App."""

    session: ChatSession | None
    engine: Backend | None
    engine_thread: EngineThread
    preferences: Preferences
    config: Config
    alternatives: int  # how many to write (alternatives_count)
    reply: AssistantMessageView | None  # the view they are written in, while they are
    _inspecting_live: bool

    def _can_send(self, text: str | None = None) -> bool: ...

    async def _reload_changed(self) -> None: ...

    async def _reply_ended(self, clean: bool) -> None: ...

    async def _show_final(self, reply: AssistantMessageView, message: ChatMessage) -> None: ...

    async def _show_conversation_saved(self) -> None: ...

    def _inspect(self, view: AssistantMessageView | None) -> None: ...


if TYPE_CHECKING:
    class _Host(AlternativesHost, App):
        """What a type checker takes `self` for: a Textual App that is an AlternativesHost."""
else:
    _Host = object


class AlternativesActions(_Host):
    """A mixin of KvchatApp; what it needs of the app is AlternativesHost."""

    _live: LiveAlternatives | None = None  # the alternatives being written, if any

    def set_alternatives(self, count: int) -> None:
        """The settings screen's new number of alternatives: used from now on, and remembered."""
        self.alternatives = count
        try:
            self.preferences.set(PREFERENCE, count)
        except OSError as exc:
            self.notify(f"The number of alternatives could not be saved ({exc.strerror or exc}); it holds until "
                        "kvchat quits.", severity="warning")

    async def action_regenerate_alternatives(self) -> None:
        if not self._can_send():
            return
        session, count = self.session, self.alternatives
        try:
            replies = session.regenerate_alternatives(count)
        except ConversationChanged:
            await self._reload_changed()
            return
        except (*USER_FACING_ERRORS, ValueError) as exc:
            self.notify(str(exc), severity="warning", timeout=10)
            return
        chat = self.query_one(ChatView)
        await chat.truncate(len(session.messages))
        view = await chat.add(ChatMessage("assistant", "", status="streaming"))
        view.choice = (0, count)
        view.refresh_header()
        self.reply, self._live = view, LiveAlternatives(replies, opens_thinking=session.opens_thinking)
        view.thinking.begin(expanded=not self.config.collapse_thinking)
        self._live.stream = Markdown.get_stream(view.body)
        self.query_one(StatusBar).begin_reply(replies.rates())
        self.notify(start_note(count, session.params.greedy, is_remote(self.engine)), timeout=8)
        engine = self.engine
        self.engine_thread.submit(lambda: stream_alternatives(replies, engine, self.post_message))

    async def on_assistant_message_view_alternatives_requested(
            self, event: AssistantMessageView.AlternativesRequested) -> None:
        if event.view.index != len(self.query_one(ChatView).messages) - 1:
            self.notify("Only the last reply can be regenerated; earlier ones: edit the message before them.",
                        severity="warning", timeout=6)
            return
        await self.action_regenerate_alternatives()

    async def on_message_view_branch_requested(self, event: MessageView.BranchRequested) -> None:
        # Runs before ReplyActions' handler (Textual calls each class's in the MRO); ‹ › on the view
        # being written shows another alternative, and the default (a branch switch) is skipped.
        live = self._live
        if live is None or event.view is not self.reply:
            return
        event.prevent_default()
        position = live.shown + event.step
        if not 0 <= position < live.replies.count:
            self.notify("There is no other alternative that way.", timeout=3)
            return
        live.replies.shown = position  # also the one the conversation shows when they end
        await self._show_alternative(position)
        self._show_live_numbers()

    async def _show_alternative(self, index: int) -> None:
        """The view shows alternative `index`: what it wrote, streaming on if it is still being written."""
        live, view = self._live, self.reply
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

    async def on_alternatives_progress(self, message: AlternativesProgress) -> None:
        live = self._live
        if live is None:
            return
        deltas = {index: live.add(index, text) for index, text in message.texts.items()}
        for index, stats in message.stats.items():
            live.stats[index] = stats
        bar = self.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.streams = message.rates
        shown = deltas.get(live.shown)
        if shown is not None and shown.thinking:
            self.reply.thinking.add(shown.thinking)
        if shown is not None and shown.answer and live.stream is not None:
            await live.stream.write(shown.answer)
        self._show_live_numbers()

    async def on_alternative_ended(self, message: AlternativeEnded) -> None:
        live = self._live
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
        live, bar = self._live, self.query_one(StatusBar)
        stats = live.stats[live.shown]
        writing = f"{live.writing()} of {live.replies.count} alternatives being written"
        if stats is None:
            bar.show(bar.phase, writing)
            return
        bar.show("decode" if live.ended[live.shown] else stats.phase, writing, stats)
        inspector = self.query_one(Inspector)
        if inspector.display and self._inspecting_live:
            inspector.show(ReplyNumbers.from_request(stats), f"alternative {live.shown + 1} being written")

    async def on_alternatives_done(self, message: AlternativesDone) -> None:
        # `self.reply` is cleared only when the screen is final, so "generating" covers all of this.
        try:
            await self._show_alternatives_end(message)
        finally:
            self.reply, self._live = None, None
            self.query_one(PromptInput).refresh_meter()  # the reply took room in the context window
        await self._reply_ended(message.adopted is not None)  # the message queued meanwhile (reply.py)

    async def _show_alternatives_end(self, message: AlternativesDone) -> None:
        live, view, session = self._live, self.reply, self.session
        if live is None or view is None or session is None:
            return
        if live.stream is not None:
            await live.stream.stop()
            live.stream = None
        bar, count = self.query_one(StatusBar), live.replies.count
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.streams = message.rates or bar.streams
        if message.errors:
            many = len(message.errors) > 1
            failed = f"{len(message.errors)} of the {count} alternatives" if many else "An alternative"
            self.notify(f"{failed} could not be written whole: {message.errors[0]}", severity="error", timeout=10)
        adopted = message.adopted
        if adopted is None:  # none kept: the conversation is as it was
            await self.query_one(ChatView).show(session.messages)
            bar.show("idle", "no alternative was kept")
            return
        shown = live.kept[live.shown]
        if live.shown != adopted and shown is not None and shown.id is not None:  # browsed as they ended
            try:
                session.switch_branch(shown.id)
                adopted = live.shown
            except USER_FACING_ERRORS as exc:
                self.notify(str(exc), severity="error", timeout=10)
        view.choice = None
        await self._show_final(view, session.messages[-1])
        kept = sum(reply is not None for reply in live.kept)
        bar.show("idle", f"{counted(kept, 'alternative')} written", live.stats[adopted])
        await self._show_conversation_saved()
        self.reply = None  # so the inspector shows the reply on screen, not "the reply being written"
        self._inspect(view)
