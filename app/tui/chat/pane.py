"""The chat pane: the conversation's messages, the message box, and the reply being written.

`ChatPane` owns the reply's state: the view of the reply being written, whether the inspector follows it,
the message queued meanwhile, and stopping it (Esc, Ctrl+C). The engine thread posts the reply's events to
it (engine_events.py), and the message box's Enter reaches it first, slash commands going through
SlashCommands (commands.py), messages through Outbox (outbox.py: sent, or queued while a reply is written).
Objects it owns do the rest, each stating what it uses of the pane as a Protocol: ReplyStream (a reply
streamed, with its prefill progress: stream.py), Branches (regenerate, edit, switch: branches.py),
AlternativesWriter (Regenerate N: alternatives.py), WaysOn (a conversation that no longer fits: overflow.py)
and ToolUse (the tools a message's replies may call: tool_use.py). The conversation's session and the engine
are the app's, whose ModelSession loads and opens them (ChatHost); the chat logic is ChatSession's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static, TextArea

from app.tui import slash_commands
from app.chat.session import ChatMessage
from app.tui.alternative_events import AlternativeEnded, AlternativesDone, AlternativesProgress
from app.tui.chat.alternatives import AlternativesWriter
from app.tui.chat.branches import Branches
from app.tui.chat.commands import SlashCommands
from app.tui.chat.outbox import Outbox
from app.tui.chat.overflow import OverflowReport, SummaryDone, SummaryPass, WaysOn
from app.tui.chat.stream import ReplyStream
from app.tui.chat.tool_events import (LoopReplyDone, ToolCallAsked, ToolCallBegan, ToolCallEnded, ToolLoopStopped,
                                      ToolRoundBegan)
from app.tui.chat.tool_use import ToolUse
from app.tui.engine_events import ReplyDone, ReplyStats, ReplyText
from app.tui.token_meter import box_reading, conversation_used
from app.tui.widgets.box_notice import BoxNotice
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.loop_timeline import loop_messages, timeline_lines
from app.tui.widgets.status_bar import clip

if TYPE_CHECKING:
    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.session import ChatSession
    from app.chat.tool_loop import ToolLoop
    from app.tools.toolbox import ToolBox
    from app.tui.chat.settings import ConversationSettings
    from app.tui.engine_thread import EngineThread
    from app.tui.model_session import ModelSession

PLACEHOLDER = "Message · Enter sends · Ctrl+J new line · Esc stops the reply"


@runtime_checkable  # so a test can check that KvchatApp keeps it
class ChatHost(Protocol):
    """What the chat pane (and the objects it owns) use of the app it is in (KvchatApp), besides Textual's
    App: the app loads the engine and opens the shown conversation's session, which the pane sends to."""

    session: ChatSession | None
    engine: Backend | None
    config: Config
    engine_thread: EngineThread
    conversation_id: str | None
    alternatives: int  # how many replies "regenerate N" writes
    settings: ConversationSettings
    model_session: ModelSession  # says whether the model and the session are ready for a message
    tools: ToolBox | None  # the tools the chat can offer the model (None: none set up)
    tool_allow: tuple[str, ...]  # the allow-list: tools that run without a question
    tool_rounds: int  # a message's replies, at most, when its replies call tools

    async def open_conversation(self, conversation_id: str | None) -> None: ...

    async def conversation_saved(self) -> None: ...

    def alternatives_of(self, message: ChatMessage) -> list[str]: ...

    async def action_new_chat(self) -> None: ...

    def action_help(self) -> None: ...


class ChatPane(Vertical):
    """The chat in the middle of the screen; it owns the reply being written (see the module's docstring)."""

    def __init__(self, host: ChatHost, history: Callable[[], list[str]], **kwargs):
        """`host`: the app it is in; `history`: the messages sent lately, which Up recalls in the box (read
        as the pane is composed)."""
        super().__init__(**kwargs)
        self.host = host
        self._history = history
        self._reply: AssistantMessageView | None = None  # the reply (or alternatives) being written
        self._inspecting_live = True  # the inspector follows the reply being written
        self.stream = ReplyStream(self)
        self.alternatives_writer = AlternativesWriter(self)
        self.ways_on = WaysOn(self)
        self.commands = SlashCommands(self)
        self.branches = Branches(self)
        self.tool_use = ToolUse(self)
        self.outbox = Outbox(self)

    def compose(self) -> ComposeResult:
        messages = ChatView(id="messages")
        messages.alternatives = self.host.alternatives_of  # before any message is shown, with its ‹ ›
        yield messages
        yield Static("", id="editing", markup=False)
        yield PromptInput(history=self._history(), id="prompt", placeholder=PLACEHOLDER)
        yield BoxNotice(id="box-notice")

    # ---- what the others ask of the reply's state

    @property
    def reply(self) -> AssistantMessageView | None:
        """The view of the reply (or alternatives) being written, if any."""
        return self._reply

    @property
    def editing(self) -> int | None:
        """The index of the user message being edited, if any (Branches')."""
        return self.branches.editing

    @property
    def compacting(self) -> bool:
        """/compact's summary is being written (overflow.py)."""
        return self.ways_on.compacting

    @property
    def generating(self) -> bool:
        """A reply is being written, or /compact's summary: the conversation takes no other message now."""
        return self._reply is not None or self.compacting

    @property
    def inspecting_live(self) -> bool:
        """The inspector follows the reply being written (not a reply chosen on screen)."""
        return self._inspecting_live

    def writing(self, view: AssistantMessageView | None) -> None:
        """`view` is the reply being written from now on (None: none is, the screen is final)."""
        self._reply = view

    # ---- sending

    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        # The box is empty already (PromptInput.submit): whatever is refused here is given back.
        typed = event.text.strip()
        text = slash_commands.parse(typed)
        if not isinstance(text, str):
            await self.commands.run(text, typed)
            return
        if not text:
            return
        if self.generating:
            self.outbox.queue(typed)
            return
        await self.outbox.send(text, typed)

    @on(PromptInput.Refused)
    def _refused(self, event: PromptInput.Refused) -> None:
        self.tell_at_box(event.sentence)

    @on(TextArea.Changed, "#prompt")
    def _box_edited(self, event: TextArea.Changed) -> None:
        self.query_one(BoxNotice).box_changed(event.text_area.text)

    def can_send(self, text: str | None = None) -> bool:
        """Can a message be sent now? If not, say why. `text` (a message typed while the model loads
        or the conversation opens) is sent by itself once the session is ready, if still in the box."""
        if self.compacting:
            self.notify("The conversation is being compacted; press Esc to stop it.", severity="warning")
        elif self.generating:
            self.notify("A reply is still being written; press Esc to stop it.", severity="warning")
        else:
            return self.host.model_session.ready_to_send(text)
        return False

    def give_back(self, typed: str, sentence: str = "", severity: str = "warning") -> None:
        """`typed` was not taken: back in the box if it is still empty, with `sentence` (if any) under the
        box until it is edited; else kept in the Up history, and a toast says why and where it went (the box's
        new text is not what the sentence is about)."""
        if self.query_one(PromptInput).give_back(typed):
            if sentence:
                self.tell_at_box(sentence)
            return
        kept = f"“{clip(typed, 40)}” is not put back, as the box has new text; Up recalls it."
        self.notify(f"{sentence} {kept}" if sentence else kept, severity=severity, timeout=10)

    def tell_at_box(self, sentence: str) -> None:
        """Say why what was just typed was not taken, under the message box (not in a toast, where a later
        notice would hide it); it stays until the box is edited."""
        self.query_one(BoxNotice).say(sentence, self.query_one(PromptInput).text)

    # ---- the message queued while a reply is written (Outbox's)

    async def reply_ended(self, clean: bool) -> None:
        """A reply (or N alternatives) ended: the queued message goes out if it ended by itself (Outbox)."""
        await self.outbox.reply_ended(clean)

    async def reload_changed(self) -> None:
        """Another kvchat added to the conversation shown: show what it is now instead of forking it."""
        await self.host.open_conversation(self.host.conversation_id)
        self.notify("This conversation got new messages in another kvchat; they are shown now. Send yours again.",
                    severity="warning", timeout=10)

    # ---- the reply, streamed (ReplyStream); the engine thread posts its events here

    async def start_reply(self, events, loop: ToolLoop | None = None) -> None:
        """Stream `events` (a ChatSession's send, edit or regenerate; or `loop`'s, each of its replies in turn)
        as the reply being written."""
        self.tool_use.started(loop)
        await self.stream.start(events, loop is not None)

    async def loop_ended(self) -> None:
        """The message's tool loop ended (ReplyStream's, before the queued message may go)."""
        await self.tool_use.loop_ended()

    # While the app shuts down (Ctrl+Q, a signal mid-reply) its screen is torn down before the engine thread's
    # last messages are handled: the session has kept the reply by then, and nothing is left to show it on.

    async def on_reply_text(self, message: ReplyText) -> None:
        if self.app.is_running:
            await self.stream.text(message)

    def on_reply_stats(self, message: ReplyStats) -> None:
        if self.app.is_running:
            self.stream.stats(message)

    async def on_reply_done(self, message: ReplyDone) -> None:
        if self.app.is_running:
            await self.stream.done(message)

    # ---- a message's tool loop (ToolUse; its replies are ReplyStream's), posted here by the engine thread

    async def on_tool_round_began(self, message: ToolRoundBegan) -> None:
        if self.app.is_running:
            self.tool_use.round_began()
            await self.stream.next_round(message)

    async def on_loop_reply_done(self, message: LoopReplyDone) -> None:
        if self.app.is_running:
            await self.stream.round_done(message)

    async def on_tool_call_asked(self, message: ToolCallAsked) -> None:
        if self.app.is_running:
            await self.tool_use.asked(message)

    async def on_tool_call_began(self, message: ToolCallBegan) -> None:
        if self.app.is_running:
            await self.tool_use.began(message)

    def on_tool_call_ended(self, message: ToolCallEnded) -> None:
        if self.app.is_running:
            self.tool_use.call_ended(message)

    def on_tool_loop_stopped(self, message: ToolLoopStopped) -> None:
        if self.app.is_running:
            self.stream.ended_early = message.reason
            self.notify(message.reason, severity="warning", timeout=10)

    async def show_final(self, reply: AssistantMessageView, message: ChatMessage) -> None:
        """The streamed reply's view becomes the session's message (its id, status and numbers)."""
        self.query_one(ChatView).messages[reply.index] = message
        await reply.finish(message, self.host.alternatives_of(message) if message.id else [])

    # ---- the events of Regenerate N and of /compact, posted here by the engine thread

    async def on_alternatives_progress(self, message: AlternativesProgress) -> None:
        await self.alternatives_writer.progress(message)

    async def on_alternative_ended(self, message: AlternativeEnded) -> None:
        await self.alternatives_writer.ended(message)

    async def on_alternatives_done(self, message: AlternativesDone) -> None:
        await self.alternatives_writer.done(message)

    def on_summary_pass(self, message: SummaryPass) -> None:
        self.ways_on.summary_pass(message)

    async def on_summary_done(self, message: SummaryDone) -> None:
        await self.ways_on.summary_done(message)

    def on_overflow_report(self, message: OverflowReport) -> None:
        self.notify(message.text, timeout=10)

    # ---- stop; regenerate, edit and switch branches (Branches)

    def interrupting(self) -> bool:
        """Ctrl+C: stop the reply (or the compacting) as Esc does; False (the key is not for this) when
        nothing is being written."""
        if not self.generating:
            return False
        self.stop()
        return True

    def stop(self) -> None:
        """Esc: stop the reply or the compacting (a message queued meanwhile comes back), else the edit."""
        session = self.host.session
        if self.compacting:
            self.outbox.take_back_queued()
            self.ways_on.stop_compacting()
        elif self.generating and session is not None:
            self.outbox.take_back_queued()  # a stopped reply sends nothing after it
            self.tool_use.stop()  # a tool loop's: no round after, no call waiting for an answer
            session.cancel()
        elif self.editing is not None:
            self.branches.stop_editing()
            self.query_one(PromptInput).clear()

    async def on_assistant_message_view_regenerate_requested(
            self, event: AssistantMessageView.RegenerateRequested) -> None:
        if self.branches.last_reply_asked(event.view):
            await self.branches.regenerate()

    async def on_assistant_message_view_alternatives_requested(
            self, event: AssistantMessageView.AlternativesRequested) -> None:
        if self.branches.last_reply_asked(event.view):
            await self.alternatives_writer.start()

    def on_user_message_view_edit_requested(self, event: UserMessageView.EditRequested) -> None:
        self.branches.start_editing(event.view.index, event.view.text)

    async def on_message_view_branch_requested(self, event: MessageView.BranchRequested) -> None:
        if not await self.alternatives_writer.browse(event):  # ‹ › on the alternatives being written, else:
            await self.branches.switch(event)

    # ---- the inspector: the reply being written, or one chosen

    def inspect(self, view: AssistantMessageView | None) -> None:
        """The inspector shows `view`'s numbers (None, or the reply being written: it follows that one)."""
        inspector = self.app.query_one(Inspector)
        self._inspecting_live = view is None or view is self._reply
        if self._inspecting_live:
            inspector.show(None)
        else:
            loop = loop_messages(self.query_one(ChatView).messages, view.index)
            inspector.show(view.message.stats, f"reply {view.index + 1}", timeline_lines(loop))

    # ---- the message box's token meter (set up once the session is ready)

    def meter_ready(self) -> None:
        """The model's tokenizer and the conversation's tokens are known now: the meter can count."""
        prompt = self.query_one(PromptInput)
        prompt.meter = self.meter_reading
        prompt.refresh_meter()

    def meter_reading(self, text: str) -> tuple[str, bool]:
        """The meter of the message box holding `text`, and whether it is over the context window (see
        token_meter.box_reading). Runs on a worker thread (it tokenizes)."""
        return box_reading(text, self.host.session, self.host.engine, self.editing)

    def context_used(self) -> int:
        """Tokens of the conversation the next message follows (see token_meter.conversation_used). May
        tokenize: a worker thread's call."""
        return conversation_used(self.host.session, self.host.engine, self.editing)
