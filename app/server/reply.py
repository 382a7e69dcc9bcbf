"""A request's replies as the API sends them: text pieces with the stop strings cut out, then a Finish each.

One request may ask for n candidate replies to one prompt: they come interleaved, each piece tagged
with its candidate's index, as the engine thread decodes them together (app/server/runner.py).

A request that offers tools has a CallWatch per candidate (app/server/call_watch.py): its text pieces are then
the reply's text without the calls' markup, its Finish carries the calls, and a reply that writes a call twice
is ended there. Stop strings apply to that text (not to the markup of a call).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from app.chat.prompt.stop_text import StopText
from app.server.call_watch import CallWatch
from app.server.runner import EngineRunner, ShuttingDown
from app.tools.spec import ToolCall
from engine import Done, Generation, TokenDelta
from engine.events import RequestStats


@dataclass(frozen=True)
class Finish:
    finish_reason: str  # OpenAI's: stop | length | tool_calls
    stats: RequestStats
    calls: tuple[ToolCall, ...] = ()  # the calls the reply made (ids given), each once


def finish_reason(engine_reason: str, stop_hit: bool, calls: list[ToolCall]) -> str:
    """OpenAI's finish reason: tool_calls when the reply made calls (as vLLM says it, even when max_tokens then
    cut the reply inside a further call: that one is dropped, the calls that read are given); length when
    max_tokens ended it; else stop."""
    if calls:
        return "tool_calls"
    return "length" if engine_reason == "length" and not stop_hit else "stop"


async def replies(runner: EngineRunner, generations: list[Generation], stops: list[str],
                  watch: Callable[[], CallWatch] | None = None) -> AsyncIterator[tuple[int, str | Finish]]:
    """(candidate index, text piece) with the stop strings applied, and one (index, Finish) per candidate;
    ShuttingDown instead of a Finish when the server's shutdown cut a reply short. `watch`: makes each
    candidate's CallWatch when the request offers tools."""
    cuts = [StopText(stops) for _ in generations]
    watches = [watch() if watch else None for _ in generations]
    events = runner.events(generations)
    try:
        async for i, event in events:
            stop, calls = cuts[i], watches[i]
            match event:
                case TokenDelta(text=piece, token_id=token_id):
                    if calls is not None:  # the text shown is the parser's, read from the ids
                        piece = calls.token(token_id) if token_id is not None and not stop.hit else ""
                        if calls.repeated:
                            generations[i].cancel()  # ends with Done("stopped") before the next step
                    if text := stop.push(piece):
                        yield i, text
                    if stop.hit:
                        generations[i].cancel()  # ends with Done("stopped") before the next step
                case Done(finish_reason=reason, stats=stats):
                    ended_by_us = stop.hit or (calls is not None and calls.repeated)
                    if reason == "stopped" and runner.stopping and not ended_by_us:
                        raise ShuttingDown()
                    made = []
                    if calls is not None:
                        tail, made = calls.end()
                        if text := stop.push(tail):
                            yield i, text
                    if tail := stop.flush():
                        yield i, tail
                    yield i, Finish(finish_reason(reason, stop.hit, made), stats, tuple(made))
    finally:
        await events.aclose()
