"""What the engine thread tells the UI while N alternatives of a reply are written (ChatSession.
regenerate_alternatives), and the loop that sends it. As for a single reply (engine_events.py), text
reaches the UI in batches, here all the alternatives' together, with their numbers."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.message import Message

from app.chat.reply.alternatives import AlternativeReplies
from app.chat.chat_message import ChatMessage
from app.chat.reply.stream_rates import StreamRates
from app.tui.engine_events import KV_REFRESH_S, TEXT_BATCH_S, failure_sentence
from engine import Done, Engine, RequestStats, Stats, TokenDelta


class AlternativesProgress(Message):
    def __init__(self, texts: dict[int, str], stats: dict[int, RequestStats], rates: StreamRates,
                 kv_cache: dict | None = None):
        """`texts`: what each alternative wrote since the last batch; `stats`: each one's latest numbers;
        `kv_cache`: engine.cache_stats() (None: not measured this time)."""
        super().__init__()
        self.texts, self.stats, self.rates, self.kv_cache = texts, stats, rates, kv_cache


class AlternativeEnded(Message):
    def __init__(self, index: int, message: ChatMessage | None, stats: RequestStats | None, error: str | None):
        """`message`: what it kept (None: nothing, it was stopped before it wrote); `stats`: its final
        numbers (None when it failed); `error`: why it failed."""
        super().__init__()
        self.index, self.message, self.stats, self.error = index, message, stats, error


class AlternativesDone(Message):
    def __init__(self, adopted: int | None, errors: list[str], rates: StreamRates | None, kv_cache: dict):
        """`adopted`: the alternative the conversation shows now (None: none was kept, it shows what it
        did before); `errors`: one sentence per alternative that failed or was not saved whole."""
        super().__init__()
        self.adopted, self.errors, self.rates, self.kv_cache = adopted, errors, rates, kv_cache


def stream_alternatives(replies: AlternativeReplies, engine: Engine, post: Callable[[Message], object]) -> None:
    """On the engine thread: write the alternatives, posting their text in batches, each one's end, and
    the end of all. Never raises: whatever happens, the UI gets an AlternativesDone."""
    texts: dict[int, list[str]] = {}
    stats: dict[int, RequestStats] = {}
    failures: dict[int, str] = {}  # the sentence for each alternative that failed
    last_post, last_kv = time.monotonic(), float("-inf")

    def flush() -> None:
        nonlocal last_post, last_kv
        kv_cache = None
        if time.monotonic() - last_kv >= KV_REFRESH_S:
            kv_cache, last_kv = engine.cache_stats(), time.monotonic()
        post(AlternativesProgress({i: "".join(parts) for i, parts in texts.items()}, dict(stats), replies.rates(),
                                  kv_cache))
        texts.clear()
        last_post = time.monotonic()

    try:
        for i, item in replies.events():
            match item:
                case TokenDelta(text=text):
                    texts.setdefault(i, []).append(text)
                case Stats(stats=numbers):
                    stats[i] = numbers
                case Done(stats=numbers):
                    stats[i] = numbers
                    flush()
                    post(AlternativeEnded(i, replies.replies[i], numbers, replies.errors[i]))
                case BaseException():
                    flush()
                    failures[i] = failure_sentence(item)
                    post(AlternativeEnded(i, replies.replies[i], None, failures[i]))
            if time.monotonic() - last_post >= TEXT_BATCH_S:
                flush()
        errors = [failures.get(i) or error for i, error in enumerate(replies.errors) if error]
        post(AlternativesDone(replies.adopted, errors, replies.rates(), engine.cache_stats()))
    except Exception as exc:  # a bug (or the conversation deleted) must not take the chat down with it
        post(AlternativesDone(replies.adopted, [failure_sentence(exc)], None, {}))
