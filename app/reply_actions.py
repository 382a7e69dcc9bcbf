"""Sending a message and what follows: the streamed reply, stop, regenerate, edit-and-resend,
and switching between branches. A mixin of KvchatApp; the chat logic itself is ChatSession's."""

from __future__ import annotations

from textual.widgets import Markdown, Static

from app.chat import ChatMessage
from app.engine_events import ReplyDone, ReplyStats, ReplyText, stream_reply
from app.saved_chat import ConversationChanged
from app.stats_text import live_stats
from app.widgets.chat_view import ChatView
from app.widgets.inspector import Inspector
from app.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.sidebar import Sidebar
from app.widgets.status_bar import StatusBar
from engine import EngineError
from storage.db import StorageError

FINISH_NOTES = {"stop": "", "length": "stopped at the length limit", "stopped": "stopped by you"}


class ReplyActions:
    # Handlers are named on_<message> rather than decorated with @on: Textual collects @on handlers
    # only from classes it creates (widgets, apps), not from a plain mixin like this one.
    """Needs: self.session, self.engine, self.engine_thread, self.reply, self.editing, self._can_send() (KvchatApp)."""

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text or not self._can_send(text):
            return
        session, editing = self.session, self.editing
        try:
            events = session.send(text) if editing is None else session.edit(editing, text)
        except ConversationChanged:
            await self._reload_changed()
            return
        except (EngineError, StorageError, ValueError) as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.clear()
        self._stop_editing()
        chat = self.query_one(ChatView)
        if editing is not None:
            await chat.truncate(editing)
        await chat.add(session.messages[-1])
        await self._start_reply(events)

    async def _reload_changed(self) -> None:
        """Another kvchat added to the conversation shown: show what it is now instead of forking it."""
        await self.open_conversation(self.conversation_id)
        self.notify("This conversation got new messages in another kvchat; they are shown now. Send yours again.",
                    severity="warning", timeout=10)

    def on_prompt_input_refused(self, event: PromptInput.Refused) -> None:
        self.notify(event.sentence, severity="warning", timeout=10)

    async def _start_reply(self, events) -> None:
        self.reply = await self.query_one(ChatView).add(ChatMessage("assistant", "", status="streaming"))
        self._stream = Markdown.get_stream(self.reply.body)
        self.query_one(StatusBar).begin_reply()
        engine = self.engine
        self.engine_thread.submit(lambda: stream_reply(events, engine, self.post_message))

    async def on_reply_text(self, message: ReplyText) -> None:
        if self._stream is not None:
            await self._stream.write(message.text)

    def on_reply_stats(self, message: ReplyStats) -> None:
        bar = self.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.show(message.stats.phase, stats=message.stats)
        inspector = self.query_one(Inspector)
        if inspector.display and self._inspecting_live:
            inspector.show(live_stats(message.stats), "the reply being written")

    async def on_reply_done(self, message: ReplyDone) -> None:
        # `self.reply` is cleared only when the screen is final, so "generating" covers all of this.
        try:
            await self._show_reply_end(message)
        finally:
            self.reply = None

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

    def action_stop(self) -> None:
        if self.generating and self.session is not None:
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
        except (EngineError, StorageError) as exc:
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
        except (EngineError, StorageError) as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        chat = self.query_one(ChatView)
        await chat.show(self.session.messages)
        for other in chat.views():
            if other.index == view.index:
                other.focus()

