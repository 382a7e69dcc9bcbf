"""Sending a message and what follows: the streamed reply, stop, regenerate, edit-and-resend,
and switching between branches; a message sent meanwhile waits its turn (queued). Slash commands typed
instead of a message are commands.py's. A mixin of KvchatApp; the chat logic itself is ChatSession's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual.actions import SkipAction
from textual.widgets import Markdown, Static

from app.tui import slash_commands
from app.chat.backend_loader import is_remote
from app.chat.prompt.context_room import ConversationTooLong
from app.chat.errors import USER_FACING_ERRORS
from app.chat.reply.stats import ReplyNumbers
from app.chat.session import ChatMessage
from app.tui.engine_events import ReplyDone, ReplyStats, ReplyText, stream_reply
from app.chat.saved.conversation import ConversationChanged
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status_bar import StatusBar, clip, thinking_counts
from engine import ContextWindowError

if TYPE_CHECKING:
    from textual.app import App
    from textual.widgets.markdown import MarkdownStream

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.session import ChatSession
    from app.tui.engine_thread import EngineThread
    from app.chat.local_models import LocalModel
    from app.tui.screens.settings import ChatSettings

FINISH_NOTES = {"stop": "", "length": "stopped at the length limit (max tokens: Ctrl+O)", "stopped": "stopped by you",
                "repetition": "stopped: it kept repeating itself"}


@runtime_checkable  # so a test can check that KvchatApp keeps it
class ReplyHost(Protocol):
    """What ReplyActions uses of the app it is mixed into (KvchatApp and its other mixins), besides
    Textual's App."""

    session: ChatSession | None
    engine: Backend | None
    config: Config
    engine_thread: EngineThread
    conversation_id: str | None
    reply: AssistantMessageView | None  # the reply being written
    editing: int | None  # the index of the user message being edited
    compacting: bool  # a summary is being written for /compact (actions/context.py)
    _stream: MarkdownStream | None  # the reply's text, streamed into its view
    _inspecting_live: bool  # the inspector follows the reply being written

    @property
    def generating(self) -> bool: ...

    def _can_send(self, text: str | None = None) -> bool: ...

    def tell_at_box(self, sentence: str) -> None: ...

    def _alternatives(self, message: ChatMessage) -> list[str]: ...

    async def open_conversation(self, conversation_id: str | None) -> None: ...

    async def action_new_chat(self) -> None: ...

    def action_help(self) -> None: ...

    def current_settings(self) -> ChatSettings: ...

    async def _apply_settings(self, old: ChatSettings, new: ChatSettings | None,
                              load_again: bool = False) -> bool: ...

    def model_choices(self) -> list[LocalModel]: ...

    def context_used(self) -> int: ...

    def _inspect(self, view: AssistantMessageView | None) -> None: ...

    def stop_compacting(self) -> None: ...

    def offer_ways_on(self, refused: ConversationTooLong) -> None: ...


if TYPE_CHECKING:
    class _Host(ReplyHost, App):
        """What a type checker takes `self` for: a Textual App that is a ReplyHost."""
else:
    _Host = object


class ReplyActions(_Host):
    """A mixin of KvchatApp; what it needs of the app is ReplyHost."""

    # Handlers are named on_<message> rather than decorated with @on: Textual collects @on handlers
    # only from classes it creates (widgets, apps), not from a plain mixin like this one.

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        # The box is empty already (PromptInput.submit): whatever is refused here is given back.
        typed = event.text.strip()
        text = slash_commands.parse(typed)
        if not isinstance(text, str):
            await self._run_command(text, typed)
            return
        if not text:
            return
        if self.generating:
            self._queue(typed)
            return
        await self._send(text, typed)

    async def _send(self, text: str, typed: str) -> None:
        if not self._can_send(typed):
            self._give_back(typed)
            return
        session, editing = self.session, self.editing
        try:
            events = session.send(text) if editing is None else session.edit(editing, text)
        except ConversationChanged:
            self._give_back(typed)
            await self._reload_changed()
            return
        except ConversationTooLong as exc:  # it would fit after fewer turns: the ways on (actions/context.py)
            self._give_back(typed)
            self.offer_ways_on(exc)
            return
        except ContextWindowError as exc:
            self._give_back(typed, f"{exc} Ctrl+L clears the box; /clear starts a new chat.", "error")
            return
        except (*USER_FACING_ERRORS, ValueError) as exc:
            self._give_back(typed, str(exc), "error")
            return
        self.query_one(PromptInput).remember(typed)
        self._stop_editing()
        chat = self.query_one(ChatView)
        if editing is not None:
            await chat.truncate(editing)
        await chat.add(session.messages[-1])
        await self._start_reply(events)

    def _give_back(self, typed: str, sentence: str = "", severity: str = "warning") -> None:
        """`typed` was not taken: back in the box if it is still empty, with `sentence` (if any) under the
        box until it is edited; else kept in the Up history, and a toast says why and where it went (the box's
        new text is not what the sentence is about)."""
        if self.query_one(PromptInput).give_back(typed):
            if sentence:
                self.tell_at_box(sentence)
            return
        kept = f"“{clip(typed, 40)}” is not put back, as the box has new text; Up recalls it."
        self.notify(f"{sentence} {kept}" if sentence else kept, severity=severity, timeout=10)

    # ---- the message queued while a reply is written (sent when it ends; see PromptInput.queue)

    def _queue(self, typed: str) -> None:
        prompt = self.query_one(PromptInput)
        if prompt.queued is not None:  # one at a time: the first is shown, this one stays in the box
            self._give_back(typed, "A message is already queued; Backspace in the empty box takes it back.")
            return
        prompt.queue(typed)

    def _take_back_queued(self) -> None:
        """The queued message returns to the box to be edited (or, if the box has new text, to the history)."""
        text = self.query_one(PromptInput).take_queued()
        if text is not None:
            self._give_back(text)

    async def _reply_ended(self, clean: bool) -> None:
        """A reply (or N alternatives) ended: the queued message goes out if it ended by itself; one stopped
        or failed gives it back to the box instead."""
        if self.generating or self.query_one(PromptInput).queued is None:
            return
        if not clean:
            self._take_back_queued()
            return
        typed = self.query_one(PromptInput).take_queued()
        text = slash_commands.parse(typed)
        await self._send(text if isinstance(text, str) else typed, typed)

    async def _reload_changed(self) -> None:
        """Another kvchat added to the conversation shown: show what it is now instead of forking it."""
        await self.open_conversation(self.conversation_id)
        self.notify("This conversation got new messages in another kvchat; they are shown now. Send yours again.",
                    severity="warning", timeout=10)

    def on_prompt_input_refused(self, event: PromptInput.Refused) -> None:
        self.tell_at_box(event.sentence)

    async def _start_reply(self, events) -> None:
        self.reply = await self.query_one(ChatView).add(ChatMessage("assistant", "", status="streaming"))
        self.reply.thinking.begin(expanded=not self.config.collapse_thinking)
        self._stream = Markdown.get_stream(self.reply.body)
        self.query_one(StatusBar).begin_reply(prefill_tokens=self._chunked_prefill())
        engine, opens_thinking = self.engine, self.session.opens_thinking
        self.engine_thread.submit(lambda: stream_reply(events, engine, self.post_message, opens_thinking))

    def _chunked_prefill(self) -> int | None:
        """The tokens the reply just sent prefills, if they take more than one chunk (the engine reports on
        those after each chunk; the bar shows 0 of them meanwhile); None otherwise, or for a server."""
        engine, session = self.engine, self.session
        if engine is None or session is None or is_remote(engine):
            return None
        tokens, options = session.unseen_prompt_tokens, getattr(engine, "options", None)
        return tokens if options is not None and tokens > options.prefill_chunk else None

    async def on_reply_text(self, message: ReplyText) -> None:
        reply = self.reply
        if reply is not None and (message.thinking or message.tokens is not None):
            block = reply.thinking
            block.tokens = message.tokens[0] if message.tokens else block.tokens
            block.add(message.thinking)
            if message.text and not block.ended:
                block.answer_began()
        if message.tokens is not None:
            bar = self.query_one(StatusBar)
            bar.thinking_tokens = message.tokens
            bar.refresh_text()
        if self._stream is not None and message.text:
            await self._stream.write(message.text)

    def on_reply_stats(self, message: ReplyStats) -> None:
        bar = self.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.show(message.stats.phase, stats=message.stats)
        inspector = self.query_one(Inspector)
        if inspector.display and self._inspecting_live:
            inspector.show(ReplyNumbers.from_request(message.stats), "the reply being written")

    async def on_reply_done(self, message: ReplyDone) -> None:
        # `self.reply` is cleared only when the screen is final, so "generating" covers all of this.
        try:
            await self._show_reply_end(message)
        finally:
            self.reply = None
        await self._reply_ended(message.done is not None and message.done.finish_reason != "stopped")

    async def _show_reply_end(self, message: ReplyDone) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        reply, bar, session = self.reply, self.query_one(StatusBar), self.session
        bar.kv_cache = message.kv_cache or bar.kv_cache
        if message.done is None:
            bar.show("idle", "failed")
            self.notify(message.error or "The reply failed.", severity="error", timeout=10)
            kept = session.messages[-1] if session and session.messages else None
            if reply is not None and kept is not None and kept.status == "interrupted":
                await self._show_final(reply, kept)  # what it said is part of the conversation now
            elif reply is not None:  # nothing was said: the empty reply is shown as interrupted
                reply.message.status = "interrupted"
                reply.refresh_header()
            await self._show_conversation_saved()  # the user's message was, whatever happened after it
            if reply is not None:
                self.reply = None  # so the inspector shows the interrupted reply, not "the reply being written"
                self._inspect(reply)
            return
        stored = session.messages[-1] if session and session.messages[-1].role == "assistant" else None
        if reply is not None and stored is not None:
            await self._show_final(reply, stored)
        bar.thinking_tokens = thinking_counts(stored.stats if stored else None) or bar.thinking_tokens
        bar.show("idle", FINISH_NOTES.get(message.done.finish_reason, message.done.finish_reason), message.done.stats)
        await self._show_conversation_saved()
        if reply is not None and stored is not None:
            self.reply = None  # so the inspector shows the finished reply, not the live one
            self._inspect(reply)

    async def _show_final(self, reply: AssistantMessageView, message: ChatMessage) -> None:
        """The streamed reply's view becomes the session's message (its id, status and numbers)."""
        self.query_one(ChatView).messages[reply.index] = message
        await reply.finish(message, self._alternatives(message) if message.id else [])

    async def _show_conversation_saved(self) -> None:
        """The sidebar lists the conversation as it now is (the first message created it)."""
        session = self.session
        if session and session.saved and session.saved.id != self.conversation_id:
            self.conversation_id = session.saved.id
        sidebar = self.query_one(Sidebar)
        await sidebar.refresh_list()
        sidebar.highlight(self.conversation_id)

    def action_interrupt(self) -> None:
        """Ctrl+C: stop the reply (or the compacting) as Esc does; otherwise the key copies or hints at Ctrl+Q."""
        if not self.generating:
            raise SkipAction()
        self.action_stop()

    def action_stop(self) -> None:
        if self.compacting:
            self._take_back_queued()
            self.stop_compacting()
        elif self.generating and self.session is not None:
            self._take_back_queued()  # a stopped reply sends nothing after it
            self.session.cancel()
        elif self.editing is not None:
            self._stop_editing()
            self.query_one(PromptInput).clear()

    async def action_regenerate(self) -> None:
        if not self._can_send():
            return
        try:
            events = self.session.regenerate()
        except ConversationChanged:
            await self._reload_changed()
            return
        except USER_FACING_ERRORS as exc:
            self.notify(str(exc), severity="warning", timeout=10)
            return
        await self.query_one(ChatView).truncate(len(self.session.messages))
        await self._start_reply(events)

    async def on_assistant_message_view_regenerate_requested(self, event: AssistantMessageView.RegenerateRequested) -> None:
        if event.view.index != len(self.query_one(ChatView).messages) - 1:
            self.notify("Only the last reply can be regenerated; earlier ones: edit the message before them.",
                        severity="warning", timeout=6)
            return
        await self.action_regenerate()

    def on_user_message_view_edit_requested(self, event: UserMessageView.EditRequested) -> None:
        self._start_editing(event.view.index, event.view.text)

    def action_edit_last(self) -> None:
        messages = self.query_one(ChatView).messages
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            self.notify("There is no message of yours to edit.", severity="warning")
            return
        self._start_editing(users[-1], messages[users[-1]].content)

    def _start_editing(self, index: int, text: str) -> None:
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.editing = index
        banner = self.query_one("#editing", Static)
        banner.update(f"Editing message {index + 1}: Enter sends it as a new branch (the old one stays, "
                      "‹ › on the message) · Esc cancels")
        banner.display = True
        prompt = self.query_one(PromptInput)
        prompt.text = text
        prompt.focus()

    def _stop_editing(self) -> None:
        self.editing = None
        self.query_one("#editing", Static).display = False

    async def on_message_view_branch_requested(self, event: MessageView.BranchRequested) -> None:
        if not self._can_send():
            return
        view = event.view
        position = view.alternatives.index(view.message.id) + event.step
        if not 0 <= position < len(view.alternatives):
            self.notify("There is no other version that way.", timeout=3)
            return
        try:
            self.session.switch_branch(view.alternatives[position])
        except USER_FACING_ERRORS as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        chat = self.query_one(ChatView)
        await chat.show(self.session.messages)
        for other in chat.views():
            if other.index == view.index:
                other.focus()

