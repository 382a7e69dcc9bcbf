"""The chat's ways on when the next message no longer fits the context window (app/chat/context_overflow.py):
the notice with its two ways (screens/context_full.py), /drop-oldest and /compact, and what each cost,
said once the reply ends. A mixin of KvchatApp, as the other actions are.

Compacting generates a summary first, on the engine thread, its pass shown in the status bar (Esc or Ctrl+C
stops it); meanwhile the app counts as generating, so a message typed then is queued as during a reply and
nothing else reaches the conversation. The new branch is made on the UI thread once it is done, as a message
is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from textual.message import Message

from app.chat.compaction import CompactionStopped, Summary, compact, compact_report, send_compacted
from app.chat.context_overflow import ConversationTooLong, drop_report, plan_drop_oldest, send_dropping_oldest
from app.chat.errors import USER_FACING_ERRORS
from app.tui.engine_events import failure_sentence
from app.tui.screens.context_full import COMPACT, DROP_OLDEST, ContextFullScreen
from app.tui.slash_commands import CommandError
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar
from engine import Done, Event

if TYPE_CHECKING:
    from app.chat.chat_message import ChatMessage
    from app.chat.session import ChatSession


class OverflowReport(Message):
    """What a drop-oldest or compacted branch left out and cost, once its first reply is done."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text


class SummaryDone(Message):
    def __init__(self, session: ChatSession, text: str, summary: Summary | None, error: str | None = None,
                 typed: str | None = None):
        """`typed`: the command that asked for it, given back to the box if there is no summary."""
        super().__init__()
        self.session, self.text, self.summary, self.error, self.typed = session, text, summary, error, typed


class SummaryPass(Message):
    """A summarizing pass begins (1, 2, ...) over `messages` messages: the status bar says so."""

    def __init__(self, number: int, messages: int):
        super().__init__()
        self.number, self.messages = number, messages


class ContextActions:
    """A mixin of KvchatApp (what it uses of it: ReplyHost in reply.py, and Textual's App)."""

    _compaction_stop: threading.Event | None = None  # set: the compacting under way stops (stop_compacting)

    def offer_ways_on(self, refused: ConversationTooLong) -> None:
        """The notice for a message that does not fit; the way chosen is taken on a new branch."""
        editing = self.editing
        self.push_screen(ContextFullScreen(str(refused)),
                         lambda way: way and self.run_worker(self._go_on(way, refused.user_text, refused.before,
                                                                         editing)))

    async def _command_drop_oldest(self, text: str) -> bool:
        return await self._go_on_command(DROP_OLDEST, text)

    async def _command_compact(self, text: str) -> bool:
        return await self._go_on_command(COMPACT, text)

    async def _go_on_command(self, way: str, text: str) -> bool:
        if not text.strip():
            raise CommandError(f"/{way} needs the message to send on the new branch, such as /{way} What next?")
        if not self._can_send():
            return False
        before = self.session.messages if self.editing is None else self.session.messages[:self.editing]
        try:
            nothing_to_drop = way == DROP_OLDEST and not plan_drop_oldest(self.session, before, text).dropped
        except USER_FACING_ERRORS as exc:  # a message too long even alone
            raise CommandError(str(exc)) from None
        if nothing_to_drop:
            raise CommandError("The conversation fits with that message; press Enter to send it as usual.")
        return await self._go_on(way, text, before, self.editing, typed=f"/{way} {text}")

    async def _go_on(self, way: str, text: str, before: list[ChatMessage], editing: int | None,
                     typed: str | None = None) -> bool:
        if not self._can_send() or self.editing != editing:
            return False
        session = self.session
        if way == COMPACT:
            self.compacting, self._compaction_stop = True, threading.Event()
            stop = self._compaction_stop
            self.query_one(StatusBar).show("compacting", f"{len(before)} messages")
            self.engine_thread.submit(lambda: self._summarize(session, text, before, typed, stop))
            return True  # under way: the command is in the Up history; stopped or failed, it comes back
        try:
            plan, events = send_dropping_oldest(session, text, before)
        except USER_FACING_ERRORS as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return False
        await self._show_new_branch(typed or text, events, lambda stats: drop_report(plan, stats))
        return True

    def stop_compacting(self) -> None:
        """Esc or Ctrl+C while compacting: the pass being written stops, and no other pass begins."""
        if self._compaction_stop is not None:
            self._compaction_stop.set()
        if self.session is not None:
            self.session.cancel()

    def _summarize(self, session: ChatSession, text: str, before: list[ChatMessage], typed: str | None,
                   stop: threading.Event) -> None:
        """Engine thread: the summary, or why there is none; `stop` set: stopped before the next pass."""
        def began(number: int) -> None:
            if stop.is_set():  # between passes, or before the first: session.cancel() had nothing to stop
                raise CompactionStopped()
            self.post_message(SummaryPass(number, len(before)))
        try:
            self.post_message(SummaryDone(session, text, compact(session, text, before, began), typed=typed))
        except Exception as exc:  # the UI must hear of the end whatever it was
            self.post_message(SummaryDone(session, text, None, failure_sentence(exc), typed))

    def on_summary_pass(self, message: SummaryPass) -> None:
        if self.compacting:
            self.query_one(StatusBar).show("compacting", f"{message.messages} messages, pass {message.number}")

    async def on_summary_done(self, message: SummaryDone) -> None:
        self.compacting = False
        if message.session is not self.session:
            return  # another conversation is shown now
        if message.summary is None:
            self.query_one(StatusBar).show("idle", "not compacted")
            if message.typed:
                self._give_back(message.typed, message.error)
            else:  # from the notice's "c": the message is still in the box
                self.notify(message.error, severity="warning", timeout=10)
            await self._reply_ended(False)  # a message queued meanwhile comes back to be sent again
            return
        try:
            events = send_compacted(self.session, message.summary, message.text)
        except USER_FACING_ERRORS as exc:
            self.query_one(StatusBar).show("idle", "not compacted")
            self.notify(str(exc), severity="error", timeout=10)
            await self._reply_ended(False)
            return
        summary = message.summary
        prompt = self.query_one(PromptInput)
        typed = prompt.text.strip() if prompt.text.strip() in (message.text, f"/compact {message.text}") else None
        await self._show_new_branch(typed, events, lambda stats: compact_report(summary))

    async def _show_new_branch(self, typed: str | None, events: Iterator[Event], report) -> None:
        """The branch just made is shown, its reply starts; `typed` (what the box held) leaves the box."""
        prompt = self.query_one(PromptInput)
        if typed is not None and prompt.text.strip() == typed.strip():
            prompt.remember(typed)
            prompt.clear()
        self._stop_editing()
        await self.query_one(ChatView).show(self.session.messages)
        await self._start_reply(self._reporting(events, report))

    def _reporting(self, events: Iterator[Event], report) -> Iterator[Event]:
        """`events` as they come (on the engine thread); at the reply's Done, what the branch cost is posted."""
        try:
            for event in events:
                yield event
                if isinstance(event, Done):
                    self.post_message(OverflowReport(report(event.stats)))
        finally:
            events.close()  # the reply's own ending: its stored K/V, the conversation's turn

    def on_overflow_report(self, message: OverflowReport) -> None:
        self.notify(message.text, timeout=10)
