"""One reply streamed into the chat: its view, its Markdown stream and its prefill progress, from the engine's
first event until the screen is final. ReplyStream is the chat pane's (pane.py), which starts it with a
reply's events and hands it the events the engine thread posts (engine_events.py); Regenerate N streams its
own way (alternatives.py). A message answered in a tool loop (chat/tool_events.py) is several replies, each
streamed into a view of its own in turn, the calls' blocks between them (chat/tool_use.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual.widgets import Markdown

from app.chat.backend_loader import is_remote
from app.chat.reply.stats import ReplyNumbers
from app.chat.session import ChatMessage
from app.tui.chat.tool_events import LoopReplyDone, ToolRoundBegan, stream_tool_loop
from app.tui.engine_events import ReplyDone, ReplyStats, ReplyText, stream_reply
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.inspector import Inspector
from app.tui.widgets.messages import AssistantMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.status_bar import StatusBar, thinking_counts

if TYPE_CHECKING:
    from textual.widgets.markdown import MarkdownStream

    from app.chat.backend import Backend
    from app.chat.config import Config
    from app.chat.session import ChatSession
    from app.tui.engine_thread import EngineThread

FINISH_NOTES = {"stop": "", "length": "stopped at the length limit (max tokens: Ctrl+O)", "stopped": "stopped by you",
                "repetition": "stopped: it kept repeating itself"}


@runtime_checkable  # so a test can check that the chat pane keeps it
class StreamPane(Protocol):
    """What ReplyStream uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: StreamHost  # the app
    reply: AssistantMessageView | None  # the view it is written in, while it is
    inspecting_live: bool  # the inspector follows the reply being written

    def writing(self, view: AssistantMessageView | None) -> None: ...

    async def reply_ended(self, clean: bool) -> None: ...

    async def show_final(self, reply: AssistantMessageView, message: ChatMessage) -> None: ...

    def inspect(self, view: AssistantMessageView | None) -> None: ...

    async def loop_ended(self) -> None: ...


class StreamHost(Protocol):
    """What ReplyStream uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None
    engine: Backend | None
    engine_thread: EngineThread
    config: Config

    async def conversation_saved(self) -> None: ...


class ReplyStream:
    """The reply being streamed, if any (the chat pane's)."""

    def __init__(self, pane: StreamPane):
        self.pane = pane
        self._markdown: MarkdownStream | None = None  # the reply's answer, streamed into its view
        self.loop = False  # the replies streamed are a tool loop's (several, one after another)
        self.ended_early: str | None = None  # why the tool loop stopped before the model was done

    async def start(self, events, loop: bool = False) -> None:
        """Stream `events` (a ChatSession's send, edit or regenerate; `loop`: a ToolLoop's, several replies
        and the tool calls between them) into a new reply view."""
        pane, host = self.pane, self.pane.host
        self.loop, self.ended_early = loop, None
        session = host.session
        if not await self._begin(session.unseen_prompt_tokens):
            events.close()  # quitting: the user's message is stored, the reply is not started
            return
        engine, opens_thinking = host.engine, session.opens_thinking
        if loop:
            host.engine_thread.submit(lambda: stream_tool_loop(events, engine, pane.post_message, session))
        else:
            host.engine_thread.submit(lambda: stream_reply(events, engine, pane.post_message, opens_thinking))

    async def _begin(self, unseen_tokens: int) -> bool:
        """A new reply view, being written from now on; `unseen_tokens`: the prompt tokens its prefill computes.
        False when the chat is quitting (no view)."""
        pane = self.pane
        view = await pane.query_one(ChatView).add(ChatMessage("assistant", "", status="streaming"))
        if view is None:
            return False
        pane.writing(view)
        view.thinking.begin(expanded=not pane.host.config.collapse_thinking)
        self._markdown = Markdown.get_stream(view.body)
        pane.app.query_one(StatusBar).begin_reply(prefill_tokens=self._chunked_prefill(unseen_tokens))
        return True

    def _chunked_prefill(self, tokens: int) -> int | None:
        """`tokens`, the prompt tokens the reply just sent prefills, if they take more than one chunk (the engine
        reports on those after each chunk; the bar shows 0 of them meanwhile); None otherwise, or for a server."""
        engine = self.pane.host.engine
        if engine is None or is_remote(engine):
            return None
        options = getattr(engine, "options", None)
        return tokens if options is not None and tokens > options.prefill_chunk else None

    # ---- a tool loop's replies, one after another

    async def round_done(self, message: LoopReplyDone) -> None:
        """A reply of the loop ended: its view shows it as kept (its numbers in its header); the loop goes on
        with its calls, or ends (ReplyDone)."""
        await self._stop_markdown()
        reply = self.pane.reply
        if reply is not None and reply.message.status == "streaming":
            await self.pane.show_final(reply, message.message)

    async def next_round(self, message: ToolRoundBegan) -> None:
        """The loop's next reply, to the tool results: a view of its own, and the bar's round."""
        await self._stop_markdown()
        self.pane.app.query_one(StatusBar).tool_round = message.index + 1
        await self._begin(message.prefill_tokens)

    async def _stop_markdown(self) -> None:
        if self._markdown is not None:
            await self._markdown.stop()
            self._markdown = None

    async def text(self, message: ReplyText) -> None:
        reply = self.pane.reply
        if reply is not None and (message.thinking or message.tokens is not None):
            block = reply.thinking
            block.tokens = message.tokens[0] if message.tokens else block.tokens
            block.add(message.thinking)
            if message.text and not block.ended:
                block.answer_began()
        if message.tokens is not None:
            bar = self.pane.app.query_one(StatusBar)
            bar.thinking_tokens = message.tokens
            bar.refresh_text()
        if self._markdown is not None and message.text:
            await self._markdown.write(message.text)

    def stats(self, message: ReplyStats) -> None:
        bar = self.pane.app.query_one(StatusBar)
        bar.kv_cache = message.kv_cache or bar.kv_cache
        bar.show(message.stats.phase, stats=message.stats)
        inspector = self.pane.app.query_one(Inspector)
        if inspector.display and self.pane.inspecting_live:
            inspector.show(ReplyNumbers.from_request(message.stats), "the reply being written")

    async def done(self, message: ReplyDone) -> None:
        # The reply is cleared only when the screen is final, so "generating" covers all of this.
        pane = self.pane
        try:
            await self._show_end(message)
            if self.loop:
                await pane.loop_ended()
        finally:
            self.loop = False
            pane.writing(None)
        await pane.reply_ended(message.done is not None and message.done.finish_reason != "stopped")
        pane.query_one(PromptInput).refresh_meter()  # the reply took room in the context window

    async def _show_end(self, message: ReplyDone) -> None:
        await self._stop_markdown()
        pane = self.pane
        reply, bar, session = pane.reply, pane.app.query_one(StatusBar), pane.host.session
        bar.kv_cache = message.kv_cache or bar.kv_cache
        shown = reply is not None and reply.message.status != "streaming"  # a tool loop's, when its round ended
        if message.done is None:
            bar.show("idle", "failed")
            pane.notify(message.error or "The reply failed.", severity="error", timeout=10)
            kept = session.messages[-1] if session and session.messages else None
            # `shown`: a tool loop failed after its last reply (running a tool, or sending the results): as it was.
            if not shown and reply is not None and kept is not None and kept.status == "interrupted":
                await pane.show_final(reply, kept)  # what it said is part of the conversation now
            elif not shown and reply is not None:  # nothing was said: the empty reply is shown as interrupted
                reply.message.status = "interrupted"
                reply.refresh_header()
            await pane.host.conversation_saved()  # the user's message was, whatever happened after it
            if reply is not None:
                pane.writing(None)  # so the inspector shows the interrupted reply, not "the reply being written"
                pane.inspect(reply)
            return
        stored = session.messages[-1] if session and session.messages[-1].role == "assistant" else None
        if reply is not None and stored is not None and not shown:
            await pane.show_final(reply, stored)
        bar.thinking_tokens = thinking_counts(stored.stats if stored else None) or bar.thinking_tokens
        note = FINISH_NOTES.get(message.done.finish_reason, message.done.finish_reason)
        bar.show("idle", "tool calls stopped" if self.ended_early else note, message.done.stats)
        await pane.host.conversation_saved()
        if reply is not None and (stored is not None or shown):
            pane.writing(None)  # so the inspector shows the finished reply, not the live one
            pane.inspect(reply)
