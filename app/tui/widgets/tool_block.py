"""A tool call in the conversation: one block per call (a tool message, role "tool": app/tools/messages.py), its
header "⚙ get_weather · 120 ms" (or what it waits for, or why it did not run), and, expanded, its arguments
(JSON, indented) and its result. `t` on it, or a click, shows or hides them; a long result starts hidden.

Everything in it is plain text: the arguments are the model's and the result a tool's (made safe by the tool
layer, never trusted), so "[bold]" or a Markdown heading in them shows as written, never as markup.
"""

from __future__ import annotations

import json

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from app.chat.session import ChatMessage
from app.chat.stats_text import format_duration
from app.chat.tool_loop import REFUSED
from app.tools.messages import call_of_result, result_tools
from app.tools.spec import ToolResult
from app.tui.widgets.messages import MessageView

# A result up to this long shows with its call; a longer one starts hidden (t shows it).
SHORT_RESULT_LINES = 6
SHORT_RESULT_CHARS = 400
# What a call being answered shows in place of its time.
LIVE_STATES = {"asking": "waiting for your approval", "running": "running…", "stopped": "not run: stopped"}


def is_long(text: str) -> bool:
    return text.count("\n") >= SHORT_RESULT_LINES or len(text) > SHORT_RESULT_CHARS


def pretty_arguments(arguments: dict) -> str:
    return json.dumps(arguments, indent=2, ensure_ascii=False) if arguments else "(none)"


def tool_message(result: ToolResult, server: str | None = None) -> ChatMessage:
    """The tool message a call's result becomes, as the session keeps it (without its id until it is stored)."""
    return ChatMessage("tool", result.text, tools=result_tools(result, server))


class ToolMessageView(MessageView):
    """A tool call and its result. `state` is the live part ("asking", "running", "stopped": LIVE_STATES),
    None once the message holds the result."""

    BINDINGS = [Binding("t", "toggle_details", "Show / hide the call's arguments and result",
                        tooltip="Show or hide a tool call's arguments and result")]
    LETTER_ACTIONS = MessageView.LETTER_ACTIONS | {"toggle_details"}

    def __init__(self, message: ChatMessage, index: int, alternatives: list[str] | None = None,
                 state: str | None = None):
        super().__init__(message, index, alternatives)
        self.state = state
        self.expanded = not is_long(message.content)
        self.toggled = False  # by the user: then a result arriving leaves it as they want it

    @property
    def tool_name(self) -> str:
        call = call_of_result(self.message.tools)
        return call.name if call else "tool"

    def who(self) -> str:
        """"⚙ get_weather · 120 ms · t shows it": what the call's block says of itself."""
        tools = self.message.tools or {}
        if self.state is not None:
            words = [LIVE_STATES[self.state]]
        elif tools.get("is_error") and self.message.content == REFUSED:
            words = ["not run: you said no"]
        else:
            ms = tools.get("ms")
            took = [format_duration(ms)] if isinstance(ms, (int, float)) and not isinstance(ms, bool) else []
            words = ["failed", *took] if tools.get("is_error") else took
        if tools.get("truncated"):
            words.append("result cut")
        words.append("t hides it" if self.expanded else "t shows it")
        return " · ".join([f"⚙ {self.tool_name}", *words])

    def details(self) -> str:
        """The call's arguments, then its result (once it has one), as plain text."""
        tools = self.message.tools or {}
        call = call_of_result(tools)
        lines = [f"server: {tools['server']}"] if tools.get("server") else []
        lines += ["arguments:", pretty_arguments(call.arguments if call else {})]
        if self.state is None:
            lines += ["", "result:", self.message.content or "(empty)"]
        return "\n".join(lines)

    def compose(self) -> ComposeResult:
        yield Static(self.header_text(), classes="header", markup=False)
        yield self.make_body()

    def make_body(self) -> Static:
        body = Static(self.details(), classes="body", markup=False)
        body.display = self.expanded
        return body

    def show(self, message: ChatMessage | None = None, state: str | None = None) -> None:
        """The call as it now is: `message` with its result (None: as it was), `state` its live part."""
        if message is not None:
            self.message = message
            if not self.toggled:
                self.expanded = not is_long(message.content)
        self.state = state
        self.redraw()

    def redraw(self) -> None:
        self.refresh_header()
        for body in self.query(".body"):  # none once the view is gone (the app quit mid-update)
            body.update(self.details())
            body.display = self.expanded

    def action_toggle_details(self) -> None:
        self.expanded = not self.expanded
        self.toggled = True
        self.redraw()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.action_toggle_details()
