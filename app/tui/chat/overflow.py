"""The chat's ways on when the next message no longer fits the context window (app/chat/context/overflow.py):
the notice with its two ways (screens/context_full.py), /drop-oldest and /compact, and what each cost,
said once the reply ends. WaysOn is the chat pane's (pane.py), which hands it the engine thread's messages.

Compacting generates a summary first, on the engine thread, its pass shown in the status bar (Esc or Ctrl+C
stops it); meanwhile the chat counts as generating, so a message typed then is queued as during a reply and
nothing else reaches the conversation. The new branch is made on the UI thread once it is done, as a message
is sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual.message import Message

from app.chat.context.compaction import CompactionStopped, Summary, compact, compact_report, send_compacted
from app.chat.context.overflow import drop_report, plan_drop_oldest, send_dropping_oldest
from app.chat.prompt.context_room import ConversationTooLong
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
    from app.chat.tool_loop import ToolLoop
    from app.tui.chat.branches import Branches
    from app.tui.chat.tool_use import ToolUse
    from app.tui.engine_thread import EngineThread


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


@runtime_checkable  # so a test can check that the chat pane keeps it
class WaysOnPane(Protocol):
    """What WaysOn uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: WaysOnHost  # the app
    editing: int | None  # the index of the user message being edited
    branches: Branches
    tool_use: ToolUse  # the loop the new branch's reply is written in, when the conversation offers tools

    def can_send(self, text: str | None = None) -> bool: ...

    def give_back(self, typed: str, sentence: str = "", severity: str = "warning") -> None: ...

    async def reply_ended(self, clean: bool) -> None: ...

    async def start_reply(self, events, loop: ToolLoop | None = None) -> None: ...


class WaysOnHost(Protocol):
    """What WaysOn uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None
    engine_thread: EngineThread


class WaysOn:
    """The ways on for a message that does not fit, and the compacting under way (the chat pane's)."""

    def __init__(self, pane: WaysOnPane):
        self.pane = pane
        self.compacting = False  # the summary is being written: the chat counts as generating
        self._compaction_stop: threading.Event | None = None  # set: the compacting under way stops

    def offer(self, refused: ConversationTooLong) -> None:
        """The notice for a message that does not fit; the way chosen is taken on a new branch."""
        pane, editing = self.pane, self.pane.editing
        pane.app.push_screen(ContextFullScreen(str(refused)),
                             lambda way: way and pane.run_worker(self._go_on(way, refused.user_text, refused.before,
                                                                             editing)))

    async def command_drop_oldest(self, text: str) -> bool:
        return await self._go_on_command(DROP_OLDEST, text)

    async def command_compact(self, text: str) -> bool:
        return await self._go_on_command(COMPACT, text)

    async def _go_on_command(self, way: str, text: str) -> bool:
        if not text.strip():
            raise CommandError(f"/{way} needs the message to send on the new branch, such as /{way} What next?")
        pane = self.pane
        if not pane.can_send():
            return False
        session = pane.host.session
        before = session.messages if pane.editing is None else session.messages[:pane.editing]
        try:
            nothing_to_drop = way == DROP_OLDEST and not plan_drop_oldest(session, before, text).dropped
        except USER_FACING_ERRORS as exc:  # a message too long even alone
            raise CommandError(str(exc)) from None
        if nothing_to_drop:
            raise CommandError("The conversation fits with that message; press Enter to send it as usual.")
        return await self._go_on(way, text, before, pane.editing, typed=f"/{way} {text}")

    async def _go_on(self, way: str, text: str, before: list[ChatMessage], editing: int | None,
                     typed: str | None = None) -> bool:
        pane = self.pane
        if not pane.can_send() or pane.editing != editing:
            return False
        session = pane.host.session
        if way == COMPACT:
            self.compacting, self._compaction_stop = True, threading.Event()
            stop = self._compaction_stop
            pane.app.query_one(StatusBar).show("compacting", f"{len(before)} messages")
            pane.host.engine_thread.submit(lambda: self._summarize(session, text, before, typed, stop))
            return True  # under way: the command is in the Up history; stopped or failed, it comes back
        try:
            loop = pane.tool_use.loop_for(session)  # before the prompt is made: it offers the tools on
            plan, events = send_dropping_oldest(session, text, before)
        except USER_FACING_ERRORS as exc:
            pane.notify(str(exc), severity="error", timeout=10)
            return False
        await self._show_new_branch(typed or text, events, lambda stats: drop_report(plan, stats), loop)
        return True

    def stop_compacting(self) -> None:
        """Esc or Ctrl+C while compacting: the pass being written stops, and no other pass begins."""
        if self._compaction_stop is not None:
            self._compaction_stop.set()
        if self.pane.host.session is not None:
            self.pane.host.session.cancel()

    def _summarize(self, session: ChatSession, text: str, before: list[ChatMessage], typed: str | None,
                   stop: threading.Event) -> None:
        """Engine thread: the summary, or why there is none; `stop` set: stopped before the next pass."""
        post = self.pane.post_message

        def began(number: int) -> None:
            if stop.is_set():  # between passes, or before the first: session.cancel() had nothing to stop
                raise CompactionStopped()
            post(SummaryPass(number, len(before)))
        try:
            post(SummaryDone(session, text, compact(session, text, before, began), typed=typed))
        except Exception as exc:  # the UI must hear of the end whatever it was
            post(SummaryDone(session, text, None, failure_sentence(exc), typed))

    def summary_pass(self, message: SummaryPass) -> None:
        if self.compacting:
            self.pane.app.query_one(StatusBar).show("compacting", f"{message.messages} messages, pass {message.number}")

    async def summary_done(self, message: SummaryDone) -> None:
        self.compacting = False
        pane = self.pane
        session = pane.host.session
        if message.session is not session:
            return  # another conversation is shown now
        bar = pane.app.query_one(StatusBar)
        if message.summary is None:
            bar.show("idle", "not compacted")
            if message.typed:
                pane.give_back(message.typed, message.error)
            else:  # from the notice's "c": the message is still in the box
                pane.notify(message.error, severity="warning", timeout=10)
            await pane.reply_ended(False)  # a message queued meanwhile comes back to be sent again
            return
        try:
            loop = pane.tool_use.loop_for(session)  # before the prompt is made: it offers the tools on
            events = send_compacted(session, message.summary, message.text)
        except USER_FACING_ERRORS as exc:
            bar.show("idle", "not compacted")
            pane.notify(str(exc), severity="error", timeout=10)
            await pane.reply_ended(False)
            return
        summary = message.summary
        prompt = pane.query_one(PromptInput)
        typed = prompt.text.strip() if prompt.text.strip() in (message.text, f"/compact {message.text}") else None
        await self._show_new_branch(typed, events, lambda stats: compact_report(summary), loop)

    async def _show_new_branch(self, typed: str | None, events: Iterator[Event], report,
                               loop: ToolLoop | None = None) -> None:
        """The branch just made is shown, its reply starts (in `loop`, with tools on); `typed` (what the box
        held) leaves the box."""
        pane = self.pane
        prompt = pane.query_one(PromptInput)
        if typed is not None and prompt.text.strip() == typed.strip():
            prompt.remember(typed)
            prompt.clear()
        pane.branches.stop_editing()
        await pane.query_one(ChatView).show(pane.host.session.messages)
        reporting = self._reporting(events, report)  # the first reply's: a loop's next rounds are its own
        await pane.start_reply(loop.run(reporting) if loop else reporting, loop)

    def _reporting(self, events: Iterator[Event], report) -> Iterator[Event]:
        """`events` as they come (on the engine thread); at the reply's Done, what the branch cost is posted."""
        try:
            for event in events:
                yield event
                if isinstance(event, Done):
                    self.pane.post_message(OverflowReport(report(event.stats)))
        finally:
            events.close()  # the reply's own ending: its stored K/V, the conversation's turn
