"""What the engine thread tells the chat of a message's tool loop (app/chat/tool_loop.py), and the question it
asks: the loop's events become small Textual messages beside the replies' own (engine_events.py), and a call
that needs the user's yes waits on the engine thread for the answer the chat's dialog gives (ApprovalBridge).

A loop's replies are streamed one after another into views of their own: each round's Done arrives as
LoopReplyDone (with the message the session kept), the next round as ToolRoundBegan, and the loop's end as
the ReplyDone every reply ends with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError

from textual.message import Message

from app.chat.session import ChatMessage, ChatSession
from app.tools.approval import Approval
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolEvent, ToolLoopEnded, ToolRound
from app.tools.spec import ToolCall, ToolResult, ToolSpec
from app.tui.engine_events import ReplyDone, ReplyPoster, failure_sentence
from engine import Done, Engine, Event


class ToolRoundBegan(Message):
    """The loop's reply number `index` (1 on: after tool results) starts; `prefill_tokens`: the prompt tokens
    it computes (the session's unseen_prompt_tokens), for the status bar's progress."""

    def __init__(self, index: int, prefill_tokens: int, opens_thinking: bool):
        super().__init__()
        self.index, self.prefill_tokens, self.opens_thinking = index, prefill_tokens, opens_thinking


class LoopReplyDone(Message):
    """One reply of the loop ended: `done` and `message`, the reply as the session kept it (its calls)."""

    def __init__(self, done: Done, message: ChatMessage):
        super().__init__()
        self.done, self.message = done, message


class ToolCallAsked(Message):
    """`call` waits for the user's answer, which `answer` takes (the engine thread waits on it)."""

    def __init__(self, call: ToolCall, tool: ToolSpec | None, answer: Future):
        super().__init__()
        self.call, self.tool, self.answer = call, tool, answer


class ToolCallBegan(Message):
    """`call` runs now (`approved`), or is not run: refused, stopped, or no such tool."""

    def __init__(self, call: ToolCall, approved: bool):
        super().__init__()
        self.call, self.approved = call, approved


class ToolCallEnded(Message):
    def __init__(self, result: ToolResult):
        super().__init__()
        self.result = result


class ToolLoopStopped(Message):
    """The loop ended before the model was done: `reason`, one sentence."""

    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason


def stream_tool_loop(events: Iterator[Event | ToolEvent], engine: Engine, post: Callable[[Message], object],
                     session: ChatSession) -> None:
    """On the engine thread: run a message's tool loop (ToolLoop.send or regenerate), posting each reply's
    events as stream_reply does, the rounds and calls between them, and the loop's end (a ReplyDone with the
    last reply's Done). Never raises: whatever happens, the UI gets a ReplyDone."""
    reply: ReplyPoster | None = None
    last: Done | None = None
    try:
        for event in events:
            match event:
                case ToolRound(index=index):
                    # Read here, on the thread that started the round: the session set them as it did.
                    if index:
                        post(ToolRoundBegan(index, session.unseen_prompt_tokens, session.opens_thinking))
                    reply = ReplyPoster(engine, post, session.opens_thinking, session.tools.call_reader())
                case ToolCallStarted(call=call, approved=approved):
                    post(ToolCallBegan(call, approved))
                case ToolCallFinished(result=result):
                    post(ToolCallEnded(result))
                case ToolLoopEnded(reason=reason):
                    post(ToolLoopStopped(reason))
                case Done():
                    reply.event(event)
                    last = event
                    # The session appended the reply before handing its Done on: this is the reply, as kept.
                    post(LoopReplyDone(event, session.messages[-1]))
                case _:
                    reply.event(event)
        post(ReplyDone(last, kv_cache=engine.cache_stats()))
    except Exception as exc:  # a bug must not take the chat (and the user's text) down with it
        post(ReplyDone(None, failure_sentence(exc)))


class ApprovalBridge:
    """ApprovalPolicy's `ask` for the chat: on the engine thread, post the question (ToolCallAsked) and wait
    for the answer the UI gives the question's Future. A stopped loop (`stopped`, the loop's event) or a
    closed chat answers NO at once, and refuse_pending() answers the question waiting, so that neither Esc
    nor quitting ever leaves the engine thread waiting on a dialog that is gone."""

    def __init__(self, post: Callable[[Message], object]):
        self.post = post
        self.stopped: threading.Event | None = None  # the running loop's: set, nothing more is asked
        self._pending: Future | None = None
        self._closed = False
        self._lock = threading.Lock()

    def ask(self, call: ToolCall, tool: ToolSpec | None) -> Approval:
        """Engine thread: the user's answer to `call` (blocks until it comes)."""
        answer: Future = Future()
        with self._lock:
            if self._closed or (self.stopped is not None and self.stopped.is_set()):
                return Approval.NO
            self._pending = answer
        try:
            self.post(ToolCallAsked(call, tool, answer))
            return answer.result()
        finally:
            with self._lock:
                self._pending = None

    def refuse_pending(self) -> None:
        """The question waiting, if any, is answered NO (the loop was stopped)."""
        with self._lock:
            if self._pending is not None:
                answer_once(self._pending, Approval.NO)

    def close(self) -> None:
        """The chat is closing: no question is asked from now on, and the one waiting is answered NO."""
        with self._lock:
            self._closed = True
        self.refuse_pending()


def answer_once(answer: Future, approval: Approval) -> None:
    """Give the question `answer` its answer, unless it has one (a stop answered it first)."""
    try:
        answer.set_result(approval)
    except InvalidStateError:  # answered already
        pass
