"""A request's replies as the API sends them: text pieces with the stop strings cut out, then a Finish each.

One request may ask for n candidate replies to one prompt: they come interleaved, each piece tagged
with its candidate's index, as the engine thread decodes them together (app/server/runner.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from app.chat.prompt.stop_text import StopText
from app.server.runner import EngineRunner, ShuttingDown
from engine import Done, Generation, TokenDelta
from engine.events import RequestStats


@dataclass(frozen=True)
class Finish:
    finish_reason: str  # OpenAI's: stop | length
    stats: RequestStats


async def replies(runner: EngineRunner, generations: list[Generation],
                  stops: list[str]) -> AsyncIterator[tuple[int, str | Finish]]:
    """(candidate index, text piece) with the stop strings applied, and one (index, Finish) per candidate;
    ShuttingDown instead of a Finish when the server's shutdown cut a reply short."""
    cuts = [StopText(stops) for _ in generations]
    events = runner.events(generations)
    try:
        async for i, event in events:
            stop = cuts[i]
            match event:
                case TokenDelta(text=piece):
                    if text := stop.push(piece):
                        yield i, text
                    if stop.hit:
                        generations[i].cancel()  # ends with Done("stopped") before the next step
                case Done(finish_reason=reason, stats=stats):
                    if reason == "stopped" and runner.stopping and not stop.hit:
                        raise ShuttingDown()
                    if tail := stop.flush():
                        yield i, tail
                    yield i, Finish("length" if reason == "length" and not stop.hit else "stop", stats)
    finally:
        await events.aclose()
