"""ToolBox: the tools a conversation offers the model and how a call of one runs. MCP servers' tools
(app/tools/mcp/) are one kind; FunctionTools, plain Python functions, are the other (the benchmarks, the
tests, an embedding program). ToolChoice says how the model must use them (OpenAI's `tool_choice`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.tools.spec import ToolCall, ToolResult, ToolSpec

CHOICES = ("auto", "none", "required")  # or a tool's name: that tool, once


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI's `tool_choice` and `parallel_tool_calls`: "auto" (the model decides), "none" (no call),
    "required" (at least one call), or a tool's name (a call of that tool)."""

    mode: str = "auto"
    parallel: bool = True

    @property
    def named(self) -> str | None:
        return None if self.mode in CHOICES else self.mode

    def after_first_round(self) -> "ToolChoice":
        """What the rounds after the first use: "required" or a named tool forced on every round would make
        the model call tools for ever, so they force the first reply only (as OpenAI's Agents SDK resets it)."""
        return self if self.mode in ("auto", "none") else ToolChoice("auto", self.parallel)


class ToolBox(Protocol):
    def specs(self) -> list[ToolSpec]:
        """The tools offered to the model (names unique)."""
        ...

    def run(self, call: ToolCall, cancel: threading.Event | None = None) -> ToolResult:
        """Run `call`; never raises for the tool's own failures (the result's text says what went wrong,
        is_error set). `cancel` set: give up waiting and return "stopped"."""
        ...


def find_tool(box: ToolBox, name: str) -> ToolSpec | None:
    return next((tool for tool in box.specs() if tool.name == name), None)


class FunctionTools:
    """Tools that are Python functions: fn(**arguments) -> text. An exception is the call's error sentence."""

    def __init__(self, functions: dict[str, tuple[ToolSpec, Callable[..., str]]],
                 made_safe: Callable[[str], tuple[str, bool]] = lambda text: (text, False)):
        """`made_safe`: text -> (text for the model, whether it was cut): the same door an MCP server's
        result goes through (app/tools/mcp/result_text.py), given by the caller with the model's budget."""
        self.functions = functions
        self.made_safe = made_safe

    def specs(self) -> list[ToolSpec]:
        return [spec for spec, _ in self.functions.values()]

    def run(self, call: ToolCall, cancel: threading.Event | None = None) -> ToolResult:
        start = time.perf_counter()
        entry = self.functions.get(call.name)
        if entry is None:
            return ToolResult(call, f"There is no tool named {call.name!r}.", is_error=True)
        try:
            text, error = str(entry[1](**call.arguments)), False
        except Exception as exc:  # the tool's failure is the model's to read, not the chat's to crash on
            text, error = f"The tool {call.name} failed: {exc}.", True
        safe, cut = self.made_safe(text)
        return ToolResult(call, safe, is_error=error, ms=(time.perf_counter() - start) * 1e3, truncated=cut)
