"""The message box's token meter: how many tokens the text being written is, and how much room the
conversation's context window has left for it.

Counting uses the model's own tokenizer (tokenizing 100,000 characters takes tens of ms, so the app
counts on a worker thread, after typing pauses); a remote server's tokenizer is out of reach, so
there the count is an estimate and says so ("≈").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.chat.backend_loader import is_remote
from engine.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from app.chat.backend import Backend
    from app.chat.session import ChatSession

# Without the model's tokenizer: English text and code average about 4 characters a token.
CHARS_PER_TOKEN_ESTIMATE = 4


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    estimated: bool  # counted without the model's tokenizer


def count_tokens(text: str, tokenizer: Tokenizer | None) -> TokenCount:
    """Tokens of `text` as a message's content (the chat template's few markers around it not counted).
    Takes tens of ms for 100,000 characters: call it off the UI thread."""
    if tokenizer is None:
        return estimate_tokens(text)
    return TokenCount(len(tokenizer.encode(text)), estimated=False)


def estimate_tokens(text: str) -> TokenCount:
    return TokenCount(-(-len(text) // CHARS_PER_TOKEN_ESTIMATE), estimated=True)


def room_left(count: TokenCount, window: int, used: int) -> int:
    """Tokens the context window of `window` tokens has left once the conversation's `used` tokens and
    the message are in it; negative when the message does not fit. The reply needs room too, so a
    message fits only while this is at least 1."""
    return window - used - count.tokens


def meter_text(count: TokenCount, window: int, used: int) -> str:
    """What the meter shows: "1,234 tokens · 6,958 of 8,192 left", "≈ 300 tokens · window n/a" (a server
    that does not say its window), "9,000 tokens · 809 over the 8,192-token window"."""
    about = "≈ " if count.estimated else ""
    tokens = f"{about}{count.tokens:,} token{'' if count.tokens == 1 else 's'}"
    if not window:
        return f"{tokens} · window n/a"
    room = room_left(count, window, used)
    if room < 1:
        return f"{tokens} · {1 - room:,} over the {window:,}-token window"
    return f"{tokens} · {about}{room:,} of {window:,} left"


def box_reading(text: str, session: ChatSession | None, engine: Backend | None,
                editing: int | None) -> tuple[str, bool]:
    """The meter of the message box holding `text`: its tokens and the context window's room left, and
    whether it is over (`editing`: the index of the message being edited, if one is). Tokenizes."""
    if engine is None or session is None:
        return meter_text(estimate_tokens(text), 0, 0), False
    count = count_tokens(text, None if is_remote(engine) else engine.tokenizer)
    window, used = engine.context_window, conversation_used(session, engine, editing)
    return meter_text(count, window, used), bool(window) and room_left(count, window, used) < 1


def conversation_used(session: ChatSession | None, engine: Backend | None, editing: int | None) -> int:
    """Tokens of the conversation the next message follows (up to the message being edited, when one
    is): the token ids the model saw, else its text counted as the meter counts (a new chat's system
    prompt, a conversation made with another tokenizer, a remote server's). May tokenize."""
    if session is None or engine is None:  # the model is being changed
        return 0
    before = session.messages if editing is None else session.messages[:editing]
    remote = is_remote(engine)
    if not remote:
        seen = len(session.seen_ids) if editing is None else (before[-1].token_end if before else 0)
        if seen:
            return seen
    texts = [session.system or ""] + [message.content for message in before]
    return count_tokens("\n".join(texts), None if remote else engine.tokenizer).tokens
