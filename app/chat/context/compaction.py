"""Compacting a conversation that outgrew the context window: the model summarizes the older turns, and a
new branch starts from the system prompt and that summary, then the message (the old branch stays saved).

The summary is a message of role "system" at the root of the new branch, its text starting with
SUMMARY_HEADER; it is the only kind of message stored with that role (the conversation's own system
prompt is a setting, not a message). Rendered, it joins the system prompt in one system turn
(prompt/summary_turns.py), since many templates (Gemma's, Mistral's) refuse a second system turn.

The summary is a separate greedy generation: the turns, then SUMMARY_INSTRUCTION as a user message. Its
max tokens are bounded (summary_budget) so that the system prompt, the summary, the message and the reply's
room fit in the window. Turns too many for one summarizing prompt are summarized in passes, oldest first,
each pass summarizing the summary so far with the next turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.chat.chat_message import ChatMessage
from app.chat.context.overflow import fits, send_on_new_branch
from app.chat.errors import ChatError
from app.chat.prompt.context_room import MessageTooLong, reply_room
from app.chat.wording import counted
from engine import Done, SamplingParams

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from app.chat.session import ChatSession
    from engine import Event

# Both short: they take room in every prompt of the branch (the header) and of each summarizing pass.
SUMMARY_HEADER = "Summary of the earlier conversation:"
SUMMARY_INSTRUCTION = "Summarize the conversation so far in short sentences: facts, names, numbers, decisions."
SUMMARY_MAX_TOKENS = 512  # a summary longer than this stops being one
# A summary takes at most this share of the window, so that a later pass has room for the summary so far,
# the instruction, some more turns and the new summary.
SUMMARY_SHARE = 8
SUMMARY_MIN_TOKENS = 16  # less room than this cannot say anything useful: drop the oldest turns instead
# Re-tokenized, a summary's text may take a few more tokens than the model generated.
RETOKENIZE_SLACK = 8


@dataclass(frozen=True)
class Summary:
    text: str  # the summary message's text (SUMMARY_HEADER first)
    summarized: int  # how many messages it stands for
    generated_tokens: int  # of the last pass
    passes: int
    finish_reason: str  # of the last pass: "length" when it was cut at its bound


class CompactionStopped(ChatError):
    def __init__(self) -> None:
        super().__init__("Compacting was stopped; the conversation is as it was.")


def summary_budget(session: ChatSession, user_text: str) -> int:
    """The most tokens the summary may take so that the new branch (system prompt, summary, message) leaves
    the reply its room. ChatError when that is too little to summarize anything."""
    window = session.engine.context_window
    if not window:
        return SUMMARY_MAX_TOKENS
    base = session.prompt_tokens([ChatMessage("system", SUMMARY_HEADER)], user_text)
    room = window - reply_room(window, session.reply_params.max_tokens) - base - RETOKENIZE_SLACK
    if room < SUMMARY_MIN_TOKENS:
        alone = session.prompt_tokens([], user_text)
        if not fits(session, alone):
            raise MessageTooLong(alone, window,
                                 reply_room(window, session.reply_params.max_tokens), True)
        raise ChatError(f"Your message leaves {max(room, 0)} tokens of the context window for a summary, too few "
                        "to compact the conversation; drop the oldest turns instead, or shorten the message.")
    return min(SUMMARY_MAX_TOKENS, window // SUMMARY_SHARE, room)


def summarize(session: ChatSession, messages: list[ChatMessage], budget: int,
              on_pass: Callable[[int], None] | None = None) -> Summary:
    """The model's summary of `messages` in at most `budget` tokens (on the engine's thread: it generates).
    `on_pass(n)` is called as pass n (1, 2, ...) begins. CompactionStopped if session.cancel() stopped it;
    ChatError if one message is too long to summarize."""
    window = session.engine.context_window
    remaining, summary, passes, done = list(messages), None, 0, None
    while remaining:
        head = [ChatMessage("system", summary)] if summary else []
        count = _turns_that_fit(session, head, remaining, budget, window)
        if count == 0:
            raise ChatError("The oldest message is too long to summarize in this model's context window; "
                            "drop the oldest turns instead.")
        if on_pass is not None:
            on_pass(passes + 1)
        done = _generate(session, [*head, *remaining[:count]], budget)
        summary = f"{SUMMARY_HEADER}\n\n{done.text.strip()}"
        remaining, passes = remaining[count:], passes + 1
    if done is None:
        raise ChatError("There is nothing before your message to compact.")
    return Summary(summary, len(messages), len(done.token_ids), passes, done.finish_reason)


def _turns_that_fit(session: ChatSession, head: list[ChatMessage], remaining: list[ChatMessage], budget: int,
                    window: int) -> int:
    """How many of `remaining` one summarizing prompt takes (after `head`), leaving `budget` for the summary.
    A pass ends after a reply where it can, so the instruction follows the model's turn, not the user's."""
    ends = [i + 1 for i, m in enumerate(remaining) if m.role == "assistant" or i + 1 == len(remaining)]
    best, low, high = 0, 0, len(ends) - 1
    while low <= high:  # more turns make a longer prompt: the most that fit, by bisection
        middle = (low + high) // 2
        tokens = session.prompt_tokens([*head, *remaining[:ends[middle]]], SUMMARY_INSTRUCTION)
        if not window or tokens + budget <= window:
            best, low = ends[middle], middle + 1
        else:
            high = middle - 1
    return best


def _generate(session: ChatSession, messages: list[ChatMessage], budget: int) -> Done:
    """One greedy summarizing pass. It extends the ids the model saw when it can, so the prefix cache
    serves the conversation's K/V and only the instruction is computed."""
    ids = session.prompt.after(session.seen_ids, [*messages, ChatMessage("user", SUMMARY_INSTRUCTION)]).ids
    params = SamplingParams(temperature=0, max_tokens=budget, stop_repetition=True)
    session.generation = generation = session.engine.generate(ids, params)
    done = None
    try:
        for event in generation:
            if isinstance(event, Done):
                done = event
    finally:
        session.generation = None
    if done is None or done.finish_reason == "stopped":
        raise CompactionStopped()
    return done


def compact(session: ChatSession, user_text: str, before: list[ChatMessage] | None = None,
            on_pass: Callable[[int], None] | None = None) -> Summary:
    """The summary of `before` (default: the branch shown), bounded to fit with `user_text` after it;
    `on_pass` as summarize() takes it."""
    messages = session.messages if before is None else before
    return summarize(session, messages, summary_budget(session, user_text), on_pass)


def send_compacted(session: ChatSession, summary: Summary, user_text: str) -> Iterator[Event]:
    """`user_text` on a new branch that starts from `summary` (from compact())."""
    return send_on_new_branch(session, [ChatMessage("system", summary.text)], user_text)


def compact_report(summary: Summary) -> str:
    cut = " (cut at its length limit)" if summary.finish_reason == "length" else ""
    passes = f" in {summary.passes} passes" if summary.passes > 1 else ""
    return (f"Compacted {counted(summary.summarized, 'message')} into a summary of "
            f"{counted(summary.generated_tokens, 'token')}{passes}{cut}, on a new branch.")

