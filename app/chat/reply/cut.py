"""A reply's events as a chat format shows them (prompt/formats.py): the text cut before the stop string that
ended it (a transcript's next "User:" line, which the engine includes), an end-of-turn marker the
tokenizer spells as text left out, and a transcript reply's leading blank dropped.

Only the text changes: the token ids stay the model's, stop tokens included, so the next turn's prompt
still extends them (prompt/ids.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from app.chat.prompt.formats import ChatFormat
from app.chat.prompt.stop_text import StopText
from app.chat.reply.alternatives import Drive
from engine import Done, Event, TokenDelta


class ReplyCut:
    """One reply's events, one at a time."""

    def __init__(self, chat_format: ChatFormat):
        marker = [chat_format.end_of_turn] if chat_format.end_of_turn else []
        self._stops = StopText([*chat_format.stops, *marker])
        self._trim_start = chat_format.reply_continues_line
        self._shown: list[str] = []

    def events(self, event: Event) -> list[Event]:
        """What `event` becomes: a TokenDelta with its text cut, or before the Done (whose text becomes
        what was shown) the text held back in case it began a stop string."""
        match event:
            case TokenDelta():
                return [dataclasses.replace(event, text=self._show(self._stops.push(event.text)))]
            case Done():
                tail = self._show(self._stops.flush())
                flushed = [TokenDelta(None, tail)] if tail else []
                return [*flushed, dataclasses.replace(event, text="".join(self._shown))]
        return [event]

    def _show(self, text: str) -> str:
        if self._trim_start and not self._shown:
            text = text.lstrip()
        if text:
            self._shown.append(text)
        return text


def cut_events(chat_format: ChatFormat | None, events: Iterator[Event]) -> Iterator[Event]:
    """`events` of one reply as `chat_format` shows them (None: the model's own template, unchanged)."""
    if chat_format is None:
        yield from events
        return
    cut = ReplyCut(chat_format)
    try:
        for event in events:
            yield from cut.events(event)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def cut_drive(chat_format: ChatFormat | None, drive: Drive) -> Drive:
    """`drive` (several replies read together, reply/alternatives.py) with each reply's events cut as above."""
    if chat_format is None:
        return drive

    def cut_together(streams, cancelled):
        cuts = [ReplyCut(chat_format) for _ in streams]
        together = drive(streams, cancelled)
        try:
            for i, item in together:
                if isinstance(item, BaseException):
                    yield i, item
                else:
                    for event in cuts[i].events(item):
                        yield i, event
        finally:
            close = getattr(together, "close", None)
            if close is not None:
                close()

    return cut_together
