"""A reply read as it streams in: the text to show, with the tool calls' markup taken out, and at its end the
calls it made.

How the markers are seen: the text the engine streams (TokenDelta.text) has its special tokens left out, and
many families' markers are special tokens ([TOOL_CALLS], <|python_tag|>, <|tool_call_start|>, harmony's
headers). So the parser reads the reply's token ids (feed_token; Done.token_ids hold them all) and decodes
them itself with special tokens kept (Tokenizer.decode_exact, through the engine's incremental detokenizer,
so no piece ends inside a character); feed_text takes text already decoded that way. What it returns to show
is that text as the tokenizer's own decode writes it: special tokens left out, a harmony reply in kvchat's
<think> convention.

The rules:
- reasoning comes before calls: markup inside a `<think>` block (app/chat/prompt/thinking.py's rules for where
  one opens and closes) is text, not a call;
- text that may be the start of a marker is held back until the next piece says what it is, so a marker split
  across pieces never reaches the text shown; `started` turns true when a call's marker is seen, so a caller
  can stop showing the reply and stream the call instead;
- a call that does not read is not raised: the reply keeps its markup as text, and finish() says why in one
  sentence; the calls that did read are kept.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.chat.prompt.thinking import THINK_CLOSE, THINK_OPEN
from app.tools.formats.harmony_markup import HEADER_STARTS, MESSAGE, HarmonySplitter
from app.tools.formats.markup import CallMarkup, MarkupError, Region, partial_marker
from app.tools.spec import ToolCall, ToolSpec
from engine.request.detokenizer import IncrementalDetokenizer
from engine.tokenizer import harmony


@dataclass(frozen=True)
class ParsedReply:
    content: str  # the reply's text without its call markup (a call that did not read keeps its markup here)
    calls: list[ToolCall] = field(default_factory=list)  # ids given (the model's own where it wrote one)
    error: str | None = None  # one sentence: why some call's markup could not be read


class RegionSplitter:
    """A reply's exact text cut, as it arrives, into the text outside calls (push's return, final) and call
    regions (`regions`) by a markup's opening and closing texts, after any thinking."""

    def __init__(self, markup: CallMarkup, opens_in_thinking: bool):
        self.markup = markup
        self.regions: list[Region] = []
        self.started = False
        self._thinking = "in" if opens_in_thinking else "undecided"  # undecided | in | over
        self._lead = ""  # the reply's start held back until it says whether a <think> opens it
        self._tail = ""  # the thinking's last characters: a </think> may be split across pieces
        self._buffer = ""  # answer text not decided yet
        self._answered = False  # the answer has begun (a bare call can no longer open it)
        self._open: Region | None = None
        self._kept = 0

    def push(self, text: str) -> str:
        out: list[str] = []
        if self._thinking == "undecided":
            self._lead += text
            head = self._lead.lstrip()
            if not head.startswith(THINK_OPEN) and (not head or THINK_OPEN.startswith(head)):
                return ""
            text, self._lead = self._lead, ""
            self._thinking = "in" if head.startswith(THINK_OPEN) else "over"
        if self._thinking == "in":
            text = self._think(text, out)
        if self._thinking == "over":
            self._answer(text, out)
        kept = "".join(out)
        self._kept += len(kept)
        return kept

    def end(self) -> str:
        """The reply ended: what was held back (an open region keeps it: a call cut short)."""
        out: list[str] = []
        if self._lead:
            self._thinking = "over"
            self._answer(self._lead, out)
            self._lead = ""
        if self._open is not None:
            self._open.body += self._buffer
        else:
            out.append(self._buffer)
        self._buffer = ""
        kept = "".join(out)
        self._kept += len(kept)
        return kept

    def _think(self, text: str, out: list[str]) -> str:
        """Thinking goes out as it comes; what follows its </think> is returned, for the answer."""
        seen = self._tail + text
        close = seen.find(THINK_CLOSE)
        if close < 0:
            out.append(text)
            self._tail = seen[-(len(THINK_CLOSE) - 1):]
            return ""
        cut = close + len(THINK_CLOSE) - len(self._tail)
        out.append(text[:cut])
        self._thinking = "over"
        return text[cut:]

    def _answer(self, text: str, out: list[str]) -> None:
        markup, self._buffer = self.markup, self._buffer + text
        while self._buffer:
            if self._open is not None:
                if not self._close_region():
                    return
                continue
            if not self._answered:
                bare = markup.opens_at_start(self._buffer)
                if bare is None:
                    return
                self._answered = True
                if bare:
                    self._open_region("", self._kept + sum(map(len, out)))
                    continue
            found = [(at, marker) for marker in markup.opens if (at := self._buffer.find(marker)) >= 0]
            if not found:
                keep = partial_marker(self._buffer, markup.opens)
                out.append(self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                return
            at, marker = min(found)
            out.append(self._buffer[:at])
            self._buffer = self._buffer[at + len(marker):]
            self._open_region(marker, self._kept + sum(map(len, out)))

    def _open_region(self, opener: str, at: int) -> None:
        self._open = Region(opener, at=at)
        self.regions.append(self._open)
        self.started = True

    def _close_region(self) -> bool:
        """Move the buffer into the open region up to its closing text; True when that closed it."""
        region, closes = self._open, self.markup.closes
        at = self._buffer.find(closes) if closes else -1
        if at < 0:
            keep = partial_marker(self._buffer, (closes,)) if closes else 0
            region.body += self._buffer[:len(self._buffer) - keep]
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        region.body += self._buffer[:at]
        region.closer = closes
        self._buffer, self._open = self._buffer[at + len(closes):], None
        return True


class ToolCallParser:
    """One reply of a model whose tool format is `tool_format` (tool_format.py), to `tools`. Feed it every
    generated token id (or exact text) in order, then flush() (the last text to show) and finish() once.

    Contract: the pieces feed_token/feed_text and flush return, joined, are the reply's content when no call
    fails to read (ParsedReply.content, give or take whitespace where call markup was taken out)."""

    def __init__(self, tool_format, tools: Sequence[ToolSpec], opens_in_thinking: bool = False):
        self._format = tool_format
        self._tools = list(tools)
        self._harmony = tool_format.markup.name == "harmony"
        self._splitter = HarmonySplitter() if self._harmony else RegionSplitter(tool_format.markup, opens_in_thinking)
        self._detokenizer = IncrementalDetokenizer(tool_format.tokenizer.decode_exact)
        self._kept: list[str] = []
        self._shown = ""  # harmony: the reply text shown so far
        self._harmony_read = ""  # harmony: the reply text of the messages ended so far
        self._harmony_tail = ""  # harmony: the exact text since the last message's end
        self._unshown = ""  # text outside calls not shown yet (the start of a special token, maybe)
        self._flushed = False

    @property
    def started(self) -> bool:
        """A call's markup has been seen: what follows is the call (until its end), not text to show."""
        return self._splitter.started

    @property
    def call_text(self) -> str:
        """The calls' markup so far, as the model wrote it (for a caller that streams a call as it comes)."""
        return "".join(region.raw for region in self._splitter.regions)

    @property
    def repeats_a_call(self) -> bool:
        """The call just closed is, word for word, one the reply already made. A small model asked for calls
        can write the same one again and again until its token limit; the chat ends the reply here
        (ChatSession) and runs the call once."""
        closed = [region.body.strip() for region in self._splitter.regions if region.closer]
        return len(closed) > 1 and closed[-1] in closed[:-1] and self._splitter.regions[-1].closer != ""

    def feed_token(self, token_id: int) -> str:
        """The next generated token; the text it adds to what is shown (often "")."""
        return self.feed_text(self._detokenizer.push(token_id))

    def feed_text(self, text: str) -> str:
        """The next piece of the reply's exact text (special tokens kept); the text it adds to what is shown."""
        return self._show(self._splitter.push(text))

    def flush(self) -> str:
        """The reply ended: the text still held back, to show (a marker's start that no marker followed)."""
        if self._flushed:
            return ""
        self._flushed = True
        shown = self.feed_text(self._detokenizer.flush())
        return shown + self._show(self._splitter.end(), final=True)

    def finish(self) -> ParsedReply:
        """The reply's content, the calls that read, and why any other could not (flushes first)."""
        self.flush()
        calls, failed, error = [], [], None
        for region in self._splitter.regions:
            try:
                read = self._format.markup.parse(self._format.body_text(region.body), self._tools, region.opener)
            except MarkupError as exc:
                failed.append(region)
                error = error or f"The model wrote a tool call that could not be read: {exc}."
                continue
            calls += [call if call.id else ToolCall(call.name, call.arguments, self._format.new_call_id())
                      for call in read]
        content = self._format.visible_text(_with_regions("".join(self._kept), failed))
        return ParsedReply(content.strip() if self._splitter.regions else content, calls, error)

    def _show(self, kept: str, final: bool = False) -> str:
        """What `kept` (text outside calls, now final) adds to the text shown. A special token's text may be
        cut across pieces fed as text: its start is held back until it is whole (or the reply ends)."""
        if not kept and not (final and self._unshown):
            return ""
        self._kept.append(kept)
        if self._harmony:
            return self._show_harmony(kept)
        self._unshown += kept
        hold = 0 if final else self._format.partial_special(self._unshown)
        ready, self._unshown = self._unshown[:len(self._unshown) - hold], self._unshown[len(self._unshown) - hold:]
        return self._format.visible_text(ready)


    def _show_harmony(self, kept: str) -> str:
        """Harmony's reading (harmony.reply_text) writes a header by what is around it, so the text from the
        first header not yet whole (or a special token's start) is read again as more arrives; what comes
        before it reads the same whatever follows, and is read once."""
        tail = self._harmony_tail + kept
        last_message = tail.rfind(MESSAGE)
        after = last_message + len(MESSAGE) if last_message >= 0 else 0
        starts = [at for token in HEADER_STARTS if (at := tail.find(token, after)) >= 0]
        cut = min([*starts, len(tail) - self._format.partial_special(tail)])
        self._harmony_read += harmony.reply_text(tail[:cut])
        self._harmony_tail = tail[cut:]
        now = self._harmony_read + harmony.reply_text(self._harmony_tail)
        if not now.startswith(self._shown):
            return ""
        added, self._shown = now[len(self._shown):], now
        return added


def _with_regions(kept: str, regions: list[Region]) -> str:
    """`kept` with the markup of `regions` put back where each stood."""
    parts, at = [], 0
    for region in sorted(regions, key=lambda r: r.at):
        parts += [kept[at:region.at], region.raw]
        at = region.at
    return "".join(parts) + kept[at:]


def special_pattern(texts) -> re.Pattern | None:
    """A pattern matching any of `texts` (longest first), for taking special tokens out of text."""
    ordered = sorted((t for t in texts if t), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None
