"""What the tool loop (app/chat/tool_loop.py) tells its reader between a message's replies, beside the
engine's events (TokenDelta, Stats, Done) of each reply: a round begins, a call waits for approval, runs,
returns; the loop ends early. The chat draws a block per call from them; `kvchat ask` lists them on stderr."""

from __future__ import annotations

from dataclasses import dataclass

from app.tools.spec import ToolCall, ToolResult


@dataclass(frozen=True)
class ToolRound:
    """Reply number `index` (0: the answer to the user's message; 1..: after tool results) starts."""

    index: int


@dataclass(frozen=True)
class ToolCallStarted:
    """The model asked for `call`; `approved` says whether it runs (False: the user said no, or it was
    not allowed without asking; its result says so to the model)."""

    call: ToolCall
    approved: bool


@dataclass(frozen=True)
class ToolCallFinished:
    result: ToolResult


@dataclass(frozen=True)
class ToolLoopEnded:
    """The loop stopped before the model was done (the rounds' limit, a stop): one sentence why."""

    reason: str


ToolEvent = ToolRound | ToolCallStarted | ToolCallFinished | ToolLoopEnded
