"""ToolLoop: one message's agent loop. The model answers; when its reply calls tools, each call is approved
(app/tools/approval.py) and run (a ToolBox: MCP servers, or functions), its result goes back as a tool message,
and the model answers again, up to `max_rounds` replies per message.

Every round is an ordinary turn of the ChatSession: its prompt extends the ids the model has seen, so the prefix
cache holds the whole conversation and a round prefills only the tool results (the status bar's and `kvchat ask
--json`'s per-round numbers show it), and the rounds are stored as messages, so a conversation with tools
resumes from disk like any other.

The loop yields the engine's events of each reply (one Done per round) with its own between them
(app/tools/events.py). Cancelling (Esc, Ctrl+C) stops the reply being written, or the call being run, and the
loop ends after it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from app.chat.session import ChatSession
from app.tools.approval import ApprovalPolicy
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolEvent, ToolLoopEnded, ToolRound
from app.tools.spec import ToolCall, ToolResult
from app.tools.toolbox import ToolBox, ToolChoice, find_tool
from engine import Done, Event

DEFAULT_MAX_ROUNDS = 8
REFUSED = "The user did not allow this tool call to run."  # a refused call's result, as the model reads it


class ToolLoop:
    def __init__(self, session: ChatSession, box: ToolBox, policy: ApprovalPolicy,
                 max_rounds: int = DEFAULT_MAX_ROUNDS, choice: ToolChoice = ToolChoice()):
        if max_rounds < 1:
            raise ValueError("tool rounds must be at least 1")
        self.session = session
        self.box = box
        self.policy = policy
        self.max_rounds = max_rounds
        self.choice = choice
        self.stopped = threading.Event()  # set by cancel(): no call starts and no round follows

    def send(self, user_text: str) -> Iterator[Event | ToolEvent]:
        """The reply to `user_text`, and the rounds its tool calls lead to."""
        self.offer()
        return self.run(self.session.send(user_text))

    def regenerate(self) -> Iterator[Event | ToolEvent]:
        """A new last reply (to the user's message or to tool results), and the rounds it leads to."""
        self.offer()
        return self.run(self.session.regenerate())

    def offer(self) -> None:
        """Offer the tools for the first reply of a message (before its prompt is made: they are part of it),
        as `choice` says; run() takes that reply's events."""
        self._offer(self.choice)

    def run(self, first: Iterator[Event]) -> Iterator[Event | ToolEvent]:
        """The rounds from `first` (a reply's events, already started on the session) on."""
        events = first
        for index in range(self.max_rounds):
            yield ToolRound(index)
            done = None
            for event in events:
                if isinstance(event, Done):
                    done = event
                yield event
            # A reply cut at its length may still hold whole calls before the one it was writing.
            ended = done is not None and done.finish_reason in ("stop", "length")
            calls = self.session.tools.last_calls if ended else []
            if not calls:
                return
            if self.stopped.is_set():
                yield ToolLoopEnded("Stopped: the tool calls of the last reply were not run.")
                return
            if index + 1 == self.max_rounds:
                yield ToolLoopEnded(f"Stopped after {self.max_rounds} replies with tool calls (the limit per "
                                    "message: max_rounds in the config); the last reply's calls were not run.")
                return
            results = []
            for call in calls:
                result = yield from self._call(call)
                results.append(result)
            if self.stopped.is_set():
                self.session.tools.keep_results(results)
                yield ToolLoopEnded("Stopped while the tools ran; their results are kept, and the model has not "
                                    "read them.")
                return
            self._offer(self.choice.after_first_round())
            servers = {r.call.name: getattr(find_tool(self.box, r.call.name), "server", None) for r in results}
            events = self.session.tools.send_results(results, servers)

    def _call(self, call: ToolCall) -> Iterator[ToolEvent]:
        """Approve and run one call; returns its result (a refusal or an unknown tool is a result too: the
        model reads why and goes on)."""
        tool = find_tool(self.box, call.name)
        if tool is None:
            yield ToolCallStarted(call, approved=False)
            names = ", ".join(t.name for t in self.box.specs()) or "none"
            result = ToolResult(call, f"There is no tool named {call.name!r}; the tools are: {names}.", is_error=True)
        elif self.stopped.is_set() or not self.policy.decide(tool, call):
            yield ToolCallStarted(call, approved=False)
            result = ToolResult(call, REFUSED, is_error=True)
        else:
            yield ToolCallStarted(call, approved=True)
            result = self.box.run(call, self.stopped)
        yield ToolCallFinished(result)
        return result

    def _offer(self, choice: ToolChoice) -> None:
        self.session.use_tools(self.box.specs(), choice)

    def cancel(self) -> None:
        """Stop the loop: the reply being written (its text is kept), a call waiting or running; no round after."""
        self.stopped.set()
        self.session.cancel()
