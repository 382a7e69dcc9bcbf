"""A conversation that outgrows the model's context window: refusing the next message in words, and the
two ways on, each a new branch so that the branch as it was stays saved untouched.

- The next prompt fits when it leaves `reply_room` tokens for the reply inside the window. Otherwise
  the message is refused before anything is stored: ConversationTooLong when the message would fit
  after fewer earlier turns, MessageTooLong when it does not fit even alone. Nothing is ever cut off
  the prompt without the user asking for it.
- Drop the oldest turns (send_dropping_oldest): the new branch holds copies of the latest turns that
  fit, then the message. The system prompt renders first as before, so its K/V come from the prefix
  cache at the same positions; the turns kept moved to new positions and are computed again, which the
  reply's stats (cached vs computed prompt tokens) show.
- Compact (context/compaction.py): the model summarizes the older turns; the new branch starts from the summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.chat.chat_message import ChatMessage
from app.chat.prompt.context_room import MessageTooLong, fits_window, reply_room
from engine import Event

if TYPE_CHECKING:
    from app.chat.session import ChatSession

def fits(session: ChatSession, tokens: int) -> bool:
    return fits_window(session.engine.context_window, session.reply_params.max_tokens, tokens)


def summaries(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The leading summary messages (role "system", see context/compaction.py): they stay when turns are dropped."""
    count = 0
    while count < len(messages) and messages[count].role == "system":
        count += 1
    return messages[:count]


@dataclass(frozen=True)
class DropPlan:
    """Which messages a drop-oldest branch keeps: the summaries first (if they fit), then the latest turns."""

    kept: list[ChatMessage]
    dropped: list[ChatMessage]
    prompt_tokens: int  # the new branch's prompt with the message
    dropped_tokens: int  # how much shorter it is than the refused one


def plan_drop_oldest(session: ChatSession, before: list[ChatMessage], user_text: str) -> DropPlan:
    """The fewest oldest turns of `before` to leave out so that `user_text` fits after the rest. A kept
    part starts at a user message (templates that need the user first, Gemma's and Mistral's, accept it).
    MessageTooLong if it does not fit even alone."""
    whole = session.prompt_tokens(before, user_text)
    pinned = summaries(before)
    for pins in ([pinned, []] if pinned else [[]]):
        rest = before[len(pinned):]
        starts = [i for i, m in enumerate(rest) if m.role == "user"] + [len(rest)]
        # Fewer turns make a shorter prompt: find the earliest start that fits by bisection.
        low, high, best = 0, len(starts) - 1, None
        while low <= high:
            middle = (low + high) // 2
            tokens = session.prompt_tokens([*pins, *rest[starts[middle]:]], user_text)
            if fits(session, tokens):
                best, high = (middle, tokens), middle - 1
            else:
                low = middle + 1
        if best is not None:
            kept = [*pins, *rest[starts[best[0]]:]]
            dropped = [m for m in before if not any(m is k for k in kept)]
            return DropPlan(kept, dropped, best[1], whole - best[1])
    window = session.engine.context_window
    raise MessageTooLong(session.prompt_tokens([], user_text), window,
                         reply_room(window, session.reply_params.max_tokens), bool(before))


def copy_to_new_branch(session: ChatSession, messages: list[ChatMessage]) -> list[ChatMessage]:
    """Copies of `messages` as a new branch from the conversation's root (in memory only, for a chat that
    is not saved). Their token ids are not copied: they stand at other positions now, so the next prompt is
    tokenized afresh and its message row holds them all. The original rows are not touched."""
    saved = session.saved
    copies, parent = [], None
    for message in messages:
        message_id = saved.copy_message(parent, message) if saved is not None else None
        copies.append(ChatMessage(message.role, message.content, 0, message_id, message.status, message.stats))
        parent = message_id
    return copies


def send_on_new_branch(session: ChatSession, kept: list[ChatMessage], user_text: str) -> Iterator[Event]:
    """Send `user_text` after copies of `kept`, a new branch; the conversation's turn is taken first, so
    the copies are made only when nobody else is writing to it (ConversationBusy, ConversationChanged)."""
    if session.saved is not None:
        session.saved.begin_turn()  # the turn the reply keeps (taking it again in send is a no-op)
    try:
        copies = copy_to_new_branch(session, kept)
    except BaseException:
        if session.saved is not None:
            session.saved.end_turn()
        raise
    return session.send_after(copies, user_text)


def send_dropping_oldest(session: ChatSession, user_text: str, before: list[ChatMessage] | None = None
                         ) -> tuple[DropPlan, Iterator[Event]]:
    """The message after the latest turns that fit of `before` (default: the branch shown; an edited
    message's: those before it), on a new branch (DropPlan: what was left out)."""
    plan = plan_drop_oldest(session, session.messages if before is None else before, user_text)
    return plan, send_on_new_branch(session, plan.kept, user_text)


def drop_report(plan: DropPlan, stats) -> str:
    """One sentence for after the reply: what was left out, and what the moved turns cost to compute
    (`stats`: the reply's RequestStats; the system prompt's K/V came from the cache)."""
    count = len(plan.dropped)
    cost = ""
    if stats is not None and stats.prefilled_tokens is not None:
        cost = (f"; the prompt cost {stats.prefilled_tokens:,} tokens to compute, {stats.cached_tokens or 0:,} "
                "came from the cache")
    return (f"Left out the oldest {count} message{'' if count == 1 else 's'} ({plan.dropped_tokens:,} tokens) on a "
            f"new branch{cost}.")
