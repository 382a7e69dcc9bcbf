"""Several alternatives of the last reply written at once ("regenerate N"), each kept as a sibling
branch of the reply they replace, as a regenerated reply is.

- They sample at the conversation's settings, alternative i (1..N) with seed + i when it has a seed
  (so none repeats the reply made with the seed itself), each with a random one when it has none.
- Greedy decoding (temperature 0) would write N copies of one reply, so a greedy conversation's
  alternatives sample at GREEDY_STANDIN_TEMPERATURE instead.
- The embedded engine decodes them side by side (engine.interleave: one step makes a token of each);
  a remote server is asked for them one after another (one_after_another).
- Each is recorded as a single reply is (reply/recorder.py): its row, token ids and stats, so a
  follow-up on any of them reuses the KV cache. Stopped, each keeps what it wrote; one stopped before
  its first token is not kept at all (an empty branch says nothing).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Protocol

from app.chat.alternatives_count import alternatives_problem
from app.chat.chat_message import ChatMessage
from app.chat.reply.recorder import ReplyRecorder
from app.chat.reply.stream_rates import StreamRates, stream_rates
from app.chat.saved.reply_writer import ConversationDeleted, ReplyNotSaved
from engine import Done, Event, SamplingParams, TokenDelta, interleave
from engine.sampling_params import MAX_SEED
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.chat.saved.conversation import SavedConversation


class AlternativesHost(Protocol):
    """What the alternatives need of their conversation (app/chat/session.py's ChatSession)."""

    saved: SavedConversation | None
    messages: list[ChatMessage]
    token_ids: bool  # the backend takes token ids (an engine), not text (a server)
    chat_format_name: str | None  # the standard format of a model without a chat template (None: its own)
    opens_thinking: bool  # the prompt ends inside an open <think> (app/chat/prompt/thinking.py)

    def end_alternatives(self, previous: list[ChatMessage], before: list[ChatMessage], prompt: list[int],
                         kept: ChatMessage | None, token_ids: list[int] | None) -> None: ...

GREEDY_STANDIN_TEMPERATURE = 0.7  # the engine's default temperature


class Stream(Protocol):
    """A reply's event stream (an engine Generation, or a server's RemoteGeneration)."""

    def __iter__(self) -> Iterator[Event]: ...

    def cancel(self) -> None: ...


# How several streams are read on one thread: (index, event or the exception that ended it); the Event
# is set once they are all cancelled. Closing the generator ends the streams still running.
Drive = Callable[[list, threading.Event], Generator[tuple[int, "Event | BaseException"], None, None]]


def alternative_params(params: SamplingParams, count: int) -> list[SamplingParams]:
    """The sampling settings of `count` alternatives of a reply made with `params`. ValueError for a
    count out of bounds."""
    problem = alternatives_problem(count)
    if problem:
        raise ValueError(f"The number of alternatives {problem}.")
    if params.greedy:
        params = dataclasses.replace(params, temperature=GREEDY_STANDIN_TEMPERATURE)
    if params.seed is None:
        return [params] * count  # each request draws its own random seed
    return [dataclasses.replace(params, seed=(params.seed + i) % (MAX_SEED + 1)) for i in range(1, count + 1)]


def side_by_side(streams: list, cancelled: threading.Event) -> Generator[tuple[int, Event | BaseException]]:
    """The embedded engine's Generations, submitted together: each step decodes a token of every one."""
    return interleave(streams)


def one_after_another(streams: list[Stream],
                      cancelled: threading.Event) -> Generator[tuple[int, Event | BaseException]]:
    """(index, event) of each stream in turn, for a backend that writes one reply at a time: a server
    is asked for the next when the one before has ended, and for none once they are `cancelled`."""
    for i, stream in enumerate(streams):
        if cancelled.is_set():
            return
        events = iter(stream)
        try:
            for event in events:
                yield i, event
        except Exception as exc:  # this one failed; the next may not
            yield i, exc
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # a consumer that walked away hangs up on the server


class AlternativeReplies:
    """N alternatives of the last reply, being written (ChatSession.regenerate_alternatives makes it).

    Iterate events() once, on the engine's thread: (index, event) as they come, or (index, exception)
    for an alternative that failed (what it wrote is kept, interrupted). `cancel()` stops them all, from
    any thread. When they have ended the conversation shows alternative `shown` (set by whoever shows
    them, as the user browses), or if that one kept nothing the first that did, or if none did the
    branch shown before; `adopted` says which (None: none)."""

    def __init__(self, session: AlternativesHost, previous: list[ChatMessage], prompt: list[int],
                 streams: list[Stream], drive: Drive):
        """`previous`: the messages shown before (the reply these replace last); `prompt`: the ids they
        answer ([] for a server, which takes text)."""
        self._session, self._previous, self._prompt = session, previous, prompt
        self._before = session.messages  # the user message is last
        self._streams, self._drive = streams, drive
        self._cancelled = threading.Event()
        self.count = len(streams)
        self.shown = 0
        self.adopted: int | None = None
        self.replies: list[ChatMessage | None] = [None] * self.count  # what each kept, once it ended
        self.errors: list[str | None] = [None] * self.count  # why one failed or was not saved whole
        self._recorders: list[ReplyRecorder] = []

    def cancel(self) -> None:
        self._cancelled.set()
        for stream in self._streams:
            stream.cancel()

    def rates(self) -> StreamRates:
        """Decode tokens/s of each alternative so far and of all together."""
        return stream_rates([recorder.timeline for recorder in self._recorders])

    def events(self) -> Iterator[tuple[int, Event | BaseException]]:
        session, saved = self._session, self._session.saved
        self._recorders = [ReplyRecorder(saved.reply_writer(len(self._prompt)) if saved else None,
                                         counts_text=not session.token_ids, chat_format=session.chat_format_name,
                                         opens_thinking=session.opens_thinking)
                           for _ in self._streams]
        dones: list[Done | None] = [None] * self.count
        deleted = False
        stream = self._drive(self._streams, self._cancelled)
        try:
            for i, item in stream:
                match item:
                    case TokenDelta():
                        self._recorders[i].token(item)
                    case Done():
                        dones[i] = item
                        self.replies[i] = self._finished(i, item)
                    case BaseException():
                        self.errors[i] = str(item) or repr(item)
                        self.replies[i] = self._recorders[i].interrupted()
                yield i, item
        except ConversationDeleted:
            deleted = True  # another kvchat deleted the conversation: nothing more of it is written
            raise
        finally:
            stream.close()  # ends the requests still running if the consumer walked away
            self._end(dones, deleted)

    def _finished(self, i: int, done: Done) -> ChatMessage | None:
        recorder = self._recorders[i]
        if done.finish_reason == "stopped" and not done.text and not recorder.has_row:
            return None  # stopped before it wrote anything
        message = recorder.finished(done, len(self._prompt) + len(done.token_ids))
        try:
            recorder.store(message, done)
        except ReplyNotSaved as exc:  # kept in memory (and as much as fitted on disk); the others go on
            self.errors[i] = str(exc)
        return message

    def _end(self, dones: list[Done | None], deleted: bool) -> None:
        if deleted:  # nothing more is written; the conversation ends at the user's message, as a reply's does
            self._session.end_alternatives(self._before, self._before, self._prompt, None, None)
            return
        for i, recorder in enumerate(self._recorders):
            if dones[i] is None and self.errors[i] is None:  # abandoned mid-way: kept as a failed one is
                self.replies[i] = recorder.interrupted()
        kept = [i for i, reply in enumerate(self.replies) if reply is not None]
        self.adopted = self.shown if self.shown in kept else (kept[0] if kept else None)
        chosen = None if self.adopted is None else self.replies[self.adopted]
        done = None if self.adopted is None else dones[self.adopted]
        try:
            self._session.end_alternatives(self._previous, self._before, self._prompt, chosen,
                                           None if done is None else list(done.token_ids))
        except StorageError as exc:
            self.errors[self.adopted or 0] = str(exc)
