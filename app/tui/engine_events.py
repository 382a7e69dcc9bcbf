"""What the engine thread tells the UI: small typed Textual messages, and the loop that sends a reply's.

The UI never waits on the engine: every job on the engine thread reports
through these messages, which Textual delivers on the UI's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from textual.message import Message

from app.chat.errors import USER_FACING_ERRORS
from app.chat.session import ChatSession
from app.chat.prompt.thinking import ThinkingSplitter
from engine import Done, Engine, Event, RequestStats, Stats, TokenDelta

# Streamed text reaches the UI at most 10 times a second: still reads as a stream, and every batch costs
# the UI a layout of the screen (the reply grows), CPU the decode shares on a small machine.
TEXT_BATCH_S = 0.1
# The KV cache's numbers go with a reply's live Stats at most once a second: cache_stats() walks the
# prefix tree (0.6 ms with 3,200 cached blocks), and a block holds 16 tokens, so the figure moves slowly.
KV_REFRESH_S = 1.0


class LoadProgress(Message):
    def __init__(self, step: str):
        super().__init__()
        self.step = step


class EngineReady(Message):
    def __init__(self, engine: Engine):
        super().__init__()
        self.engine = engine


class EngineFailed(Message):
    def __init__(self, error: str, retry: bool = False):
        """`retry`: trying again may work (a server that was not reachable), unlike a missing model."""
        super().__init__()
        self.error, self.retry = error, retry


class SessionReady(Message):
    """The conversation opened as `ticket` can now take messages (its K/V restored if it had any)."""

    def __init__(self, ticket: int, session: ChatSession):
        super().__init__()
        self.ticket, self.session = ticket, session


class SessionFailed(Message):
    def __init__(self, ticket: int, error: str):
        super().__init__()
        self.ticket, self.error = ticket, error


class ReplyText(Message):
    def __init__(self, text: str, thinking: str = "", tokens: tuple[int, int] | None = None):
        """`text`: the answer's new text; `thinking`: the reasoning's (app/chat/prompt/thinking.py); `tokens`:
        (thinking, answer) tokens so far, for a reply that has thought (else None)."""
        super().__init__()
        self.text, self.thinking, self.tokens = text, thinking, tokens


class ReplyStats(Message):
    def __init__(self, stats: RequestStats, kv_cache: dict | None = None):
        """`kv_cache`: engine.cache_stats() as the reply runs (None: not measured this time)."""
        super().__init__()
        self.stats, self.kv_cache = stats, kv_cache


class ReplyDone(Message):
    def __init__(self, done: Done | None, error: str | None = None, kv_cache: dict | None = None):
        super().__init__()
        self.done, self.error, self.kv_cache = done, error, kv_cache or {}


def failure_sentence(exc: BaseException) -> str:
    """One sentence for what ended a reply (the app's, the engine's and storage's errors already are one)."""
    if isinstance(exc, USER_FACING_ERRORS):
        return str(exc)
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return "The reply ran out of memory; try a shorter conversation or a smaller --kv-cache-gb."
    return f"The reply failed unexpectedly ({exc!r})."


class ReplyPoster:
    """One reply's events as the engine thread posts them: its text in batches (its thinking apart from its
    answer; `opens_thinking`: the prompt ended inside an open <think>), its stats, and its Done (kept in
    `done`, for the caller's end of the reply)."""

    def __init__(self, engine: Engine, post: Callable[[Message], object], opens_thinking: bool = False,
                 calls=None):
        """`calls`: the reply's call reader (SessionTools.call_reader) when tools are offered to an embedded
        model: the text shown is its text, the call markup left out (the call's block shows the call)."""
        self.engine, self.post = engine, post
        self.calls = calls
        self.split = ThinkingSplitter(opens_thinking)
        self.pending: list[str] = []
        self.thinking: list[str] = []
        self.done: Done | None = None
        self.last_post = time.monotonic()
        self.last_kv = float("-inf")

    def event(self, event: Event) -> None:
        match event:
            case TokenDelta(text=text):
                if self.calls is not None and event.token_id is not None:
                    text = self.calls.feed_token(event.token_id)
                delta = self.split.push(text, token=event.token_id is not None or bool(text))
                self.pending.append(delta.answer)
                self.thinking.append(delta.thinking)
                if time.monotonic() - self.last_post >= TEXT_BATCH_S:
                    self._post_text()
                    self.last_post = time.monotonic()
            case Stats(stats=stats):
                kv_cache = None
                if time.monotonic() - self.last_kv >= KV_REFRESH_S:  # the request's blocks count from the start
                    kv_cache, self.last_kv = self.engine.cache_stats(), time.monotonic()
                self.post(ReplyStats(stats, kv_cache))
            case Done():
                if self.calls is not None:  # the text the reader held back (a marker's start that was not one)
                    held = self.split.push(self.calls.flush(), token=False)
                    self.pending.append(held.answer)
                    self.thinking.append(held.thinking)
                end = self.split.flush()
                self.pending.append(end.answer)
                self.thinking.append(end.thinking)
                if any(self.pending) or any(self.thinking):
                    self._post_text()
                self.done = event

    def _post_text(self) -> None:
        split = self.split
        tokens = (split.thinking_tokens, split.answer_tokens) if split.had_thinking else None
        self.post(ReplyText("".join(self.pending), "".join(self.thinking), tokens))
        self.pending.clear()
        self.thinking.clear()


def stream_reply(events: Iterator[Event], engine: Engine, post: Callable[[Message], object],
                 opens_thinking: bool = False) -> None:
    """On the engine thread: run a reply, posting its events (ReplyPoster) and its end.
    Never raises: whatever happens, the UI gets a ReplyDone."""
    reply = ReplyPoster(engine, post, opens_thinking)
    try:
        for event in events:
            reply.event(event)
        # After the stream: the request's blocks are back in the cache and the stats include them.
        post(ReplyDone(reply.done, kv_cache=engine.cache_stats()))
    except Exception as exc:  # a bug must not take the chat (and the user's text) down with it
        post(ReplyDone(None, failure_sentence(exc)))
