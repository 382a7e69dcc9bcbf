"""How much of the context window a reply needs, and the refusals when a prompt leaves it less.

Kept apart from the ways on (context/overflow.py, context/compaction.py) so that the chat session can check
every turn without importing them.
"""

from __future__ import annotations

from collections.abc import Callable

from app.chat.chat_message import ChatMessage
from engine.errors import ContextWindowError

# The room a reply needs at least: a few sentences. A prompt that leaves less would get a reply cut
# off after a word or two (finish reason "length"), which reads like a broken model, so the message is
# refused and the ways on are offered instead. A small window gives a reply at most an eighth of it
# (a 2,048-token model keeps 256, a 256-token one 32), and a reply asked to be shorter than the room
# (max tokens) needs no more than that.
REPLY_ROOM_TOKENS = 256
REPLY_ROOM_SHARE = 8


def reply_room(window: int, max_tokens: int | None = None) -> int:
    room = min(REPLY_ROOM_TOKENS, max(1, window // REPLY_ROOM_SHARE))
    return min(room, max_tokens) if max_tokens else room


class MessageTooLong(ContextWindowError):
    """The message does not fit even alone after the system prompt: no way on but a shorter message."""

    def __init__(self, prompt_tokens: int, context_window: int, room: int, has_history: bool):
        self.prompt_tokens, self.context_window, self.room = prompt_tokens, context_window, room
        after = " (dropping or compacting earlier turns would not make room)" if has_history else ""
        Exception.__init__(self, f"The message is {prompt_tokens:,} tokens with the system prompt and the reply "
                                 f"needs {room:,} more, but the model's context window is {context_window:,} "
                                 f"tokens; shorten the message{after}.")


class ConversationTooLong(ContextWindowError):
    """The conversation with the message leaves too little room for a reply, but the message would fit
    after fewer earlier turns: drop the oldest turns or compact them, on a new branch."""

    def __init__(self, prompt_tokens: int, context_window: int, room: int, user_text: str,
                 before: list[ChatMessage] | None = None):
        self.prompt_tokens, self.context_window, self.room = prompt_tokens, context_window, room
        self.user_text = user_text  # the message refused, to send again on the new branch
        self.before = before or []  # the messages it was to follow (fewer than the branch's for an edit)
        Exception.__init__(self, f"This conversation is {prompt_tokens:,} tokens with your message and the reply "
                                 f"needs {room:,} more, but the model's context window is {context_window:,} tokens; "
                                 "drop the oldest turns or compact them into a summary, on a new branch (this one "
                                 "stays as it is).")


def fits_window(window: int, max_tokens: int | None, tokens: int) -> bool:
    """Whether a prompt of `tokens` leaves a reply its room (no window known: always)."""
    return not window or tokens + reply_room(window, max_tokens) <= window


def require_room(window: int, max_tokens: int | None, tokens: int, alone: Callable[[], int],
                 before: list[ChatMessage], user_text: str) -> None:
    """Raise ConversationTooLong or MessageTooLong unless a prompt of `tokens` (`before` and `user_text`)
    leaves the reply its room; `alone()`: the tokens of the message after the system prompt only.
    Called before anything of the turn is stored."""
    if fits_window(window, max_tokens, tokens):
        return
    room = reply_room(window, max_tokens)
    alone_tokens = alone() if before else tokens
    if not fits_window(window, max_tokens, alone_tokens):
        raise MessageTooLong(alone_tokens, window, room, bool(before))
    raise ConversationTooLong(tokens, window, room, user_text, before)
