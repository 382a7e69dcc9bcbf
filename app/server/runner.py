"""How the API server runs the engine: every job on one worker thread, events handed to the event loop.

Requests run one after another on a single-thread executor: torch's OpenMP team
belongs to the thread that starts it, and one engine thread decodes fastest (see
app/tui/engine_thread.py). Chat templates and tokenizing run on a second single
thread, so a long prompt never holds up the reply being generated (one thread:
Hugging Face fast tokenizers can fail with "Already borrowed" when several
threads call them at once; the engine thread only decodes, which borrows the
tokenizer read-only). The event loop never waits on either; a request's
events reach it through an asyncio.Queue. A consumer that goes away (a client
that disconnected) cancels its generation, which then ends before its next
decode step, and the engine closes the sequence, freeing its KV blocks.
`stop()` (the server is shutting down) cancels every generation and refuses new
ones with ShuttingDown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from engine import Done, Generation, TokenDelta
from engine.events import RequestStats

log = logging.getLogger("kvchat")

T = TypeVar("T")
_END = object()


@dataclass(frozen=True)
class Finish:
    finish_reason: str  # OpenAI's: stop | length
    stats: RequestStats


class ShuttingDown(Exception):
    """The server is stopping: the request was refused, or its reply cut short."""

    def __init__(self) -> None:
        super().__init__("The server is shutting down; send the request again once it is back.")


class EngineRunner:
    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvchat-serve")
        self.tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvchat-tokenize")
        self.active: set[Generation] = set()
        self.stopping = False

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread and wait for it, from outside the event loop (loading the model
        there puts torch's thread team on the thread that will generate)."""
        return self.executor.submit(fn).result()

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread (after the jobs before it) and return its result."""
        self._refuse_if_stopping()
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def prepare(self, fn: Callable[[], T]) -> T:
        """Run `fn` (chat template, tokenizer: a prompt's preparation) on the tokenizer thread."""
        self._refuse_if_stopping()
        result = await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, fn)
        self._refuse_if_stopping()  # the server began to stop while this prompt was prepared
        return result

    def _refuse_if_stopping(self) -> None:
        if self.stopping:
            raise ShuttingDown()

    async def events(self, generation: Generation) -> AsyncIterator[TokenDelta | Done]:
        """The generation's TokenDelta and Done events, computed on the engine thread.
        Leaving the loop early (or being cancelled) cancels the generation. If the server is already
        stopping, ShuttingDown at once and nothing runs."""
        if self.stopping:
            generation.cancel()
            raise ShuttingDown()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: object) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone (the server stopped): nobody is listening
                generation.cancel()

        def work() -> None:
            try:
                for event in generation:
                    match event:
                        case Done(finish_reason="stopped", stats=stats):
                            log.info("kvchat serve: a request stopped after %d tokens", stats.generated_tokens)
                            put(event)
                        case TokenDelta() | Done():  # the live Stats are not sent to a client
                            put(event)
            except Exception as exc:  # an EngineError (out of memory) or a bug: the request fails, not the server
                put(exc)
            finally:
                put(_END)

        self.active.add(generation)
        try:
            self.executor.submit(work)
            while (item := await queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            generation.cancel()  # nothing if it ended; else it stops before its next step
            self.active.discard(generation)

    def stop(self) -> None:
        """The server is shutting down: every generation in progress ends before its next step (its
        consumer gets ShuttingDown), and new requests are refused. Call on the event loop's thread."""
        self.stopping = True
        for generation in list(self.active):
            generation.cancel()

    def close(self) -> None:
        """Stop every generation in progress and end the engine and tokenizer threads."""
        self.stop()
        self.tokenizer_thread.shutdown(wait=True, cancel_futures=True)
        self.executor.shutdown(wait=True, cancel_futures=True)


class StopText:
    """A reply's text cut before the first of the stop strings; holds back text that may begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""
        self.hit = False

    def push(self, text: str) -> str:
        """The text that is safe to send now."""
        if self.hit:
            return ""
        if not self.stops:
            return text
        self.pending += text
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            out, self.pending = self.pending[: min(found)], ""
            return out
        hold = next((k for k in range(min(max(map(len, self.stops)) - 1, len(self.pending)), 0, -1)
                     if any(s.startswith(self.pending[-k:]) for s in self.stops)), 0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.hit else self.pending), ""
        return out


async def reply(runner: EngineRunner, generation: Generation, stops: list[str]) -> AsyncIterator[str | Finish]:
    """The reply's text pieces (stop strings applied), then one Finish; ShuttingDown instead of the
    Finish when the server's shutdown cut the reply short."""
    stop = StopText(stops)
    events = runner.events(generation)
    try:
        async for event in events:
            match event:
                case TokenDelta(text=piece):
                    if text := stop.push(piece):
                        yield text
                    if stop.hit:
                        generation.cancel()  # ends with Done("stopped") before the next step
                case Done(finish_reason=reason, stats=stats):
                    if reason == "stopped" and runner.stopping and not stop.hit:
                        raise ShuttingDown()
                    if tail := stop.flush():
                        yield tail
                    yield Finish("length" if reason == "length" and not stop.hit else "stop", stats)
    finally:
        await events.aclose()
