"""How the API server runs the engine: one engine thread decodes every request together, events go to the event loop.

All engine work happens on one thread: torch's OpenMP team belongs to the thread that starts it, and
one engine thread decodes fastest (see app/tui/engine_thread.py). That thread runs a driver loop:
between two engine steps it takes what the event loop sent it (new generations, consumers that left,
jobs from `run`/`call`), then runs one `Engine.step()` for every running request at once (continuous
batching: a step computes each decoding request's next token in one pass over the weights) and hands
each generation's new events to its consumer's asyncio.Queue. A finished, failed or abandoned
generation leaves the loop and its KV is freed (`Generation.close`). With nothing to serve the thread
blocks on its inbox: no busy loop, no polling.

A group of generations (n candidate replies to one prompt) starts its first member at once and the
others once the first has its first token: its prompt's full KV blocks are then in the prefix cache,
so the others prefill only the prompt's last, partial block.

Chat templates and tokenizing run on a second single thread, so a long prompt never holds up the
replies being generated (one thread: Hugging Face fast tokenizers can fail with "Already borrowed"
when several threads call them at once; the engine thread only decodes, which borrows the tokenizer
read-only). The event loop never waits on either. A request that fails (an EngineError, a bug) fails
alone: its exception goes to its consumer and the others go on. A consumer that goes away (a client
that disconnected) cancels its generations, which the driver closes before its next step. `stop()`
(the server is shutting down) cancels every generation and refuses new ones with ShuttingDown.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from engine import Done, Generation, TokenDelta

if TYPE_CHECKING:
    from engine import Engine

log = logging.getLogger("kvchat")

T = TypeVar("T")
_END = object()  # a generation's events are all delivered
_STOP = object()  # the driver ends


class ShuttingDown(Exception):
    """The server is stopping: the request was refused, or its reply cut short."""

    def __init__(self) -> None:
        super().__init__("The server is shutting down; send the request again once it is back.")


@dataclass(eq=False)
class _Stream:
    """One generation the driver serves. Touched by the engine thread only, once sent there."""

    generation: Generation
    index: int  # in its group
    group: list[Generation]  # its consumer's generations: all cancelled if the consumer's loop is gone
    loop: asyncio.AbstractEventLoop  # the consumer's
    inbox: asyncio.Queue  # the consumer's: lists of (index, item) pairs, put on its loop
    leader: "_Stream | None" = None  # starts once the leader's first token arrived (or the leader left)
    started: bool = False
    has_token: bool = False

    def deliver(self, items: list) -> None:
        """Hand (index, item) pairs to the consumer now (called on the engine thread)."""
        _post(self.loop, [(self, items)])


def _post(loop: asyncio.AbstractEventLoop, posts: list[tuple[_Stream, list]]) -> None:
    """Put each stream's items in its consumer's inbox, with one wake-up of their event loop: a step's
    tokens for every stream on that loop at once (one call_soon_threadsafe, a write to the loop's wake-up
    pipe, per step instead of one per stream: with 4 streams they were ~6% of the engine thread's time)."""
    try:
        loop.call_soon_threadsafe(_put_all, posts)
    except RuntimeError:  # the event loop is gone (the server stopped): nobody is listening
        for stream, _ in posts:
            for generation in stream.group:
                generation.cancel()


def _put_all(posts: list[tuple[_Stream, list]]) -> None:
    for stream, items in posts:
        stream.inbox.put_nowait(items)


@dataclass(frozen=True)
class _Leave:
    streams: list[_Stream]  # their consumer is gone


@dataclass(frozen=True)
class _Job:
    fn: Callable[[], object]
    future: Future = field(default_factory=Future)

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001  (the caller gets it, as concurrent.futures does)
            self.future.set_exception(exc)


class EngineRunner:
    def __init__(self) -> None:
        self.engine: Engine | None = None  # set by attach(); the driver steps it
        self.tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvchat-tokenize")
        self.active: set[Generation] = set()  # generations whose consumer is still listening
        self.stopping = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        # Not a daemon: the interpreter must not tear torch down under a running step. Started by the
        # first job or generation, so a runner never used (an app built, never served) leaves no thread.
        self._thread = threading.Thread(target=self._drive, name="kvchat-serve", daemon=False)
        self._start_lock = threading.Lock()
        self._closed = False

    def attach(self, engine: Engine) -> None:
        """The engine whose steps the driver runs (it may have been loaded with `run` first)."""
        self.engine = engine

    def _send(self, item: object) -> None:
        with self._start_lock:
            if self._closed:
                raise ShuttingDown()
            self._inbox.put(item)
            if self._thread.ident is None:
                self._thread.start()

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread and wait for it, from outside the event loop (loading the model
        there puts torch's thread team on the thread that will generate)."""
        if threading.current_thread() is self._thread:
            return fn()  # already there: waiting for itself would never end
        job = _Job(fn)
        self._send(job)
        return job.future.result()

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread, between two steps, and return its result."""
        self._refuse_if_stopping()
        job = _Job(fn)
        self._send(job)
        return await asyncio.wrap_future(job.future)

    async def prepare(self, fn: Callable[[], T]) -> T:
        """Run `fn` (chat template, tokenizer: a prompt's preparation) on the tokenizer thread."""
        self._refuse_if_stopping()
        result = await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, fn)
        self._refuse_if_stopping()  # the server began to stop while this prompt was prepared
        return result

    def _refuse_if_stopping(self) -> None:
        if self.stopping:
            raise ShuttingDown()

    async def events(self, generations: list[Generation]) -> AsyncIterator[tuple[int, TokenDelta | Done]]:
        """(index, event) of the generations' TokenDelta and Done events, as the engine thread's steps make
        them; the first generation starts at once, the others once it has its first token (they share its
        prompt). A generation's error is raised here. Leaving the loop early (or being cancelled) cancels
        them all. If the server is already stopping, ShuttingDown at once and nothing runs."""
        if self.stopping:
            for generation in generations:
                generation.cancel()
            raise ShuttingDown()
        if self.engine is None:
            raise RuntimeError("EngineRunner.attach(engine) was not called")
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        streams: list[_Stream] = []
        for i, generation in enumerate(generations):
            streams.append(_Stream(generation, i, generations, loop, inbox, leader=streams[0] if streams else None))
        self.active.update(generations)
        try:
            self._send(streams)  # as one item: the driver never sees a group's followers after its leader's token
            remaining = len(streams)
            while remaining:
                for index, item in await inbox.get():
                    if item is _END:
                        remaining -= 1
                    elif isinstance(item, BaseException):
                        raise item
                    else:
                        yield index, item
        finally:
            for generation in generations:
                generation.cancel()  # nothing if it ended; else it stops before its next step
                self.active.discard(generation)
            self._inbox.put(_Leave(streams))  # no thread (closed): nothing to free there either

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
        with self._start_lock:
            self._closed = True
            started = self._thread.ident is not None
        if started:
            self._inbox.put(_STOP)
            self._thread.join()

    # ---- the engine thread

    def _drive(self) -> None:
        streams: dict[_Stream, None] = {}  # an ordered set: the order they came in
        try:
            self._serve(streams)
        except BaseException:  # a bug in the loop itself: fail what is left rather than hang every consumer
            log.exception("kvchat serve: the engine thread failed")
            with self._start_lock:
                self._closed = True
            self._end(streams)
            raise

    def _serve(self, streams: dict[_Stream, None]) -> None:
        while True:
            wait = not streams  # nothing to serve: sleep until there is; else take what came, then step
            while True:
                try:
                    item = self._inbox.get(block=wait)
                except queue.Empty:
                    break
                wait = False
                if item is _STOP:
                    self._end(streams)
                    return
                self._take(item, streams)
            if streams:
                self._step(streams)

    def _take(self, item: object, streams: dict[_Stream, None]) -> None:
        if isinstance(item, _Job):
            item.run()
        elif isinstance(item, list):  # a group of streams, its leader first
            for stream in item:
                streams[stream] = None
                if stream.leader is None:
                    self._start(stream)
        elif isinstance(item, _Leave):
            for stream in item.streams:
                if stream in streams:
                    self._leave(stream, streams)

    @staticmethod
    def _start(stream: _Stream) -> None:
        stream.started = True
        stream.generation.submit()

    def _leave(self, stream: _Stream, streams: dict[_Stream, None]) -> None:
        del streams[stream]
        try:
            stream.generation.close()  # nothing if it finished; else it ends now and its KV is freed
        except Exception:  # a bug freeing one request must not end the thread every other one needs
            log.exception("kvchat serve: closing a generation failed")
        self._start_followers(stream, streams)

    def _start_followers(self, leader: _Stream, streams: dict[_Stream, None]) -> None:
        for stream in streams:
            if stream.leader is leader and not stream.started:
                self._start(stream)

    def _step(self, streams: dict[_Stream, None]) -> None:
        """One engine step for every running request, then each stream's new events to its consumer."""
        try:
            self.engine.step()
        except Exception as exc:  # the step loop fails requests itself; this is a bug outside any one of them
            log.exception("kvchat serve: an engine step failed")
            for stream in list(streams):
                stream.deliver([(stream.index, exc)])
                self._leave(stream, streams)
            return
        outgoing: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, list]]] = {}
        for stream in list(streams):
            if stream.started:
                items = self._hand_out(stream, streams)
                if items:
                    outgoing.setdefault(stream.loop, []).append((stream, items))
        for loop, posts in outgoing.items():
            _post(loop, posts)

    def _hand_out(self, stream: _Stream, streams: dict[_Stream, None]) -> list:
        """The stream's new (index, item) pairs for its consumer (an error is delivered at once)."""
        try:
            events = stream.generation.take()
        except Exception as exc:  # an EngineError (out of memory) or a bug: this request fails, not the others
            stream.deliver([(stream.index, exc)])
            self._leave(stream, streams)
            return []
        items = []
        for event in events:
            match event:
                case Done(finish_reason="stopped", stats=stats):
                    log.info("kvchat serve: a request stopped after %d tokens", stats.generated_tokens)
                    items.append((stream.index, event))
                case TokenDelta() | Done():  # the live Stats are not sent to a client
                    items.append((stream.index, event))
        if not stream.has_token and any(isinstance(event, TokenDelta) for event in events):
            stream.has_token = True
            self._start_followers(stream, streams)  # its prompt's blocks are in the prefix cache now
        if stream.generation.done:
            items.append((stream.index, _END))
            self._leave(stream, streams)
        return items

    def _end(self, streams: dict[_Stream, None]) -> None:
        """The runner is closing: free every generation left (its consumer gets ShuttingDown) and refuse
        the jobs still queued."""
        for stream in list(streams):
            stream.deliver([(stream.index, ShuttingDown())])
            self._leave(stream, streams)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Job) and item.future.set_running_or_notify_cancel():
                item.future.set_exception(ShuttingDown())
