"""ReplyRecorder: one reply as its events arrive (text, token ids, timeline), written to its row as it
streams, and the ChatMessage it ends as. A single reply (ChatSession) and each of several alternatives
decoded side by side (reply/alternatives.py) are recorded the same way."""

from __future__ import annotations

import logging

from app.chat.chat_message import ChatMessage
from app.chat.prompt.thinking import ThinkingSplitter
from app.chat.reply.timeline import ReplyTimeline
from app.chat.saved.conversation import reply_stats
from app.chat.saved.reply_writer import ReplyNotSaved, ReplyWriter
from engine import Done, TokenDelta
from storage.errors import StorageError

log = logging.getLogger("kvchat")


class ReplyRecorder:
    def __init__(self, writer: ReplyWriter | None, counts_text: bool, chat_format: str | None = None,
                 opens_thinking: bool = False):
        """`writer`: the reply's row (None: a conversation kept in memory only). `counts_text`: each
        text chunk counts as a token (a remote server's events carry no token ids). `chat_format`: the
        standard format its prompt was written in (a model without a chat template), kept in its stats
        for the inspector. `opens_thinking`: the prompt ended inside a `<think>` block, so the reply
        starts as reasoning (prompt/thinking.py)."""
        self.writer = writer
        self.chat_format = chat_format
        self.thinking = ThinkingSplitter(opens_thinking)  # counts the reasoning's tokens apart
        self.pieces: list[str] = []
        self.ids: list[int] = []
        self.timeline = ReplyTimeline()
        self._counts_text = counts_text

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def has_row(self) -> bool:
        return self.writer is not None and self.writer.message_id is not None

    def token(self, event: TokenDelta) -> None:
        """A piece of the reply; saved now and then (ReplyWriter.progress). ConversationDeleted if the
        conversation is gone."""
        self.pieces.append(event.text)
        if event.token_id is not None:
            self.ids.append(event.token_id)
        counts = event.token_id is not None or (self._counts_text and bool(event.text))
        self.thinking.push(event.text, token=counts)
        if counts:
            self.timeline.token(step=event.step)
        if self.writer is not None:
            self.writer.progress(self.pieces, self.ids)

    def finished(self, done: Done, token_end: int) -> ChatMessage:
        """The message the reply ended as (`token_end`: the conversation's token count after it)."""
        stats = reply_stats(done, self.timeline.rates(), self.timeline.step_sizes())
        if self.chat_format is not None:
            stats["chat_format"] = self.chat_format
        stats.update(self.thinking_stats())
        status = "stopped" if done.finish_reason == "stopped" else "complete"
        return ChatMessage("assistant", done.text, token_end, None, status, stats)

    def thinking_stats(self) -> dict:
        """What the reply's stats keep of its reasoning: its tokens and the answer's (the status bar shows
        them), and whether its prompt opened the block, which the stored text alone cannot tell; {} for
        a reply without thinking, so other replies' stats are as they were."""
        splitter = self.thinking
        if not splitter.had_thinking:
            return {}
        stats = {"thinking_tokens": splitter.thinking_tokens, "answer_tokens": splitter.answer_tokens}
        if splitter.opens_in_thinking:
            stats["opens_thinking"] = True
        return stats

    def store(self, message: ChatMessage, done: Done) -> None:
        """Write the finished reply (`message`, from finished()) and give it its row's id. ReplyNotSaved,
        after giving it the id of what was kept (or None), if the end could not be written."""
        if self.writer is None:
            return
        try:
            # The message's text: the reply's, but for the call markup of a reply that made tool calls.
            message.id = self.writer.done(message.content, list(done.token_ids), message.status, message.stats,
                                          message.tools)
        except ReplyNotSaved as exc:
            message.id = exc.message_id  # what was kept; the next message follows it
            raise

    def interrupted(self) -> ChatMessage | None:
        """The reply ended without its Done (an engine or server error, or nobody read on): what it said,
        kept as interrupted, as a conversation opened again shows it; None if it said nothing. Runs while
        that error propagates, so a storage failure here is only logged."""
        message_id = None
        if self.writer is not None:
            if self.writer.message_id is not None or self.pieces:
                try:
                    self.writer.done(self.text, self.ids, "interrupted", None)
                except StorageError as exc:
                    log.warning("kvchat: the interrupted reply could not be saved (%s)", exc)
            message_id = self.writer.message_id
        text = self.text
        return ChatMessage("assistant", text, 0, message_id, "interrupted") if text else None
