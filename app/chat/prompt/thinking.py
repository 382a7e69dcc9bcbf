"""A reasoning model's reply, split into its thinking and its answer.

Qwen3, the DeepSeek-R1 distills, SmolLM3 and others write `<think> ... </think>` before the answer.
The stored message keeps the reply as the model wrote it, tags and all (nothing is lost, and the next
prompt gets the full text: the chat template decides what earlier reasoning it keeps); the split is
derived wherever the reply is shown.

The rules, the same for a whole reply (split_reply) and for one streaming in (ThinkingSplitter):
- thinking opens with `<think>` before any other text (leading whitespace aside), or at the very
  start when the prompt itself ends with an open `<think>` (R1-distill templates end with it);
- it ends at the first `</think>`; everything after is the answer (its leading whitespace dropped),
  even another `<think>`: a reply that talks about tags is not a second block;
- a reply stopped, or cut at its length limit, inside the block is all thinking and no answer;
- a block with nothing but whitespace in it is no thinking (Qwen3 writes one when told not to think).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.stats_text import format_count

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReplyParts:
    thinking: str | None  # None: the reply has no thinking (or an empty block)
    answer: str
    thinking_ended: bool = True  # False: the reply stopped inside its thinking


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether the prompt's text ends with an open `<think>` (only whitespace after it), so the reply
    starts as thinking without writing the tag. Only its very end counts: a user's message that
    mentions the tag leaves the reply as it is."""
    return prompt_text.rstrip().endswith(THINK_OPEN)


def template_switches_thinking(chat_template) -> bool:
    """Whether a chat template (its source, or a dict of named ones) reads `enable_thinking`, the
    variable Qwen3's templates take to turn thinking off."""
    sources = chat_template.values() if isinstance(chat_template, dict) else [chat_template]
    return any(isinstance(source, str) and "enable_thinking" in source for source in sources)


def split_reply(text: str, opens_in_thinking: bool | None = None) -> ReplyParts:
    """`text` (a whole reply) split. `opens_in_thinking`: the prompt ended inside `<think>`; None: not
    known (a message saved without the flag), then a `</think>` with no `<think>` before it says so."""
    if opens_in_thinking is None:
        close = text.find(THINK_CLOSE)
        opens_in_thinking = close >= 0 and THINK_OPEN not in text[:close]
    if opens_in_thinking:
        body = text
    elif text.lstrip().startswith(THINK_OPEN):
        body = text.lstrip()[len(THINK_OPEN):]
    else:
        return ReplyParts(None, text)
    thinking, closed, answer = body.partition(THINK_CLOSE)
    return ReplyParts(thinking.strip() or None, answer.lstrip(), bool(closed))


def stored_reply_parts(text: str, stats: dict | None) -> ReplyParts:
    """A saved reply's parts. Its stats say whether its prompt opened the thinking (ReplyRecorder keeps
    `opens_thinking` only when it did); a reply kept without stats (interrupted) is read by its text."""
    if not isinstance(stats, dict):
        return split_reply(text, None)
    return split_reply(text, stats.get("opens_thinking") is True)


def thinking_counts_text(thinking_tokens: int, answer_tokens: int) -> str:
    """"think 120 · answer 48 tok": a reasoning reply's tokens, as the status bar and `ask` say them."""
    return f"think {format_count(thinking_tokens)} · answer {format_count(answer_tokens)} tok"


@dataclass(frozen=True)
class ThinkingDelta:
    thinking: str = ""
    answer: str = ""


_START, _THINK_START, _THINKING, _ANSWER_START, _ANSWER = range(5)


class ThinkingSplitter:
    """A streaming reply split as its text arrives. Text that may be the start of a tag is held back
    until the next piece says what it is, so a tag split across pieces never reaches the answer.

    Contract: the answers of push() and flush() joined equal split_reply(whole).answer, and their
    thinking joined and stripped equals its thinking (or "" for None).

    It also counts tokens: a token (push(text, token=True)) is thinking if it was written inside the
    block, opened it or closed it; else it is the answer's. Those held back at the start count as
    whatever their text turns out to be."""

    def __init__(self, opens_in_thinking: bool = False):
        self.opens_in_thinking = opens_in_thinking
        self._state = _THINK_START if opens_in_thinking else _START
        self._held = ""
        self._undecided = 0  # tokens of the text held back at the start (whitespace, part of "<think>")
        self.thinking_tokens = 0
        self.answer_tokens = 0
        self.had_thinking = opens_in_thinking

    @property
    def in_thinking(self) -> bool:
        return self._state in (_THINK_START, _THINKING)

    def push(self, text: str, token: bool = False) -> ThinkingDelta:
        """The next piece of the reply; what it adds to the thinking and to the answer."""
        was_thinking = self.in_thinking
        delta = self._split(self._held + text)
        if token:
            self._undecided += 1
            if self._state != _START:  # what the tokens held back at the start were is known now
                if was_thinking or self.in_thinking or delta.thinking:
                    self.thinking_tokens += self._undecided
                else:
                    self.answer_tokens += self._undecided
                self._undecided = 0
        return delta

    def flush(self) -> ThinkingDelta:
        """The reply ended: whatever was held back (a partial tag that never completed is text)."""
        held, self._held = self._held, ""
        self.answer_tokens, self._undecided = self.answer_tokens + self._undecided, 0
        if self._state == _START:
            return ThinkingDelta(answer=held)
        if self._state == _THINKING:
            return ThinkingDelta(thinking=held)
        return ThinkingDelta()  # the whitespace just after a tag

    def _split(self, text: str) -> ThinkingDelta:
        thinking, answer = [], []
        self._held = ""
        while text:
            if self._state == _START:
                head = text.lstrip()
                if not head or (len(head) < len(THINK_OPEN) and THINK_OPEN.startswith(head)):
                    self._held = text  # whitespace, or maybe the opening tag: wait for more
                    break
                if head.startswith(THINK_OPEN):
                    self._state, self.had_thinking, text = _THINK_START, True, head[len(THINK_OPEN):]
                else:
                    self._state = _ANSWER
            elif self._state in (_THINK_START, _ANSWER_START):
                text = text.lstrip()
                if text:
                    self._state += 1  # _THINKING, _ANSWER
            elif self._state == _THINKING:
                before, closed, after = text.partition(THINK_CLOSE)
                if closed:
                    thinking.append(before)
                    self._state, text = _ANSWER_START, after
                    continue
                keep = _partial_tag(text, THINK_CLOSE)
                thinking.append(text[:len(text) - keep])
                self._held = text[len(text) - keep:]
                break
            else:
                answer.append(text)
                break
        return ThinkingDelta("".join(thinking), "".join(answer))


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is the start of `tag` (0: none)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
