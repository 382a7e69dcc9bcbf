"""The question before a tool call runs: which tool, from which server, with which arguments, and three
answers: once (y, Enter), always for this tool in this conversation (a), no (n). Esc stops the whole reply
(the call is not run either), as it does everywhere in the chat.

The arguments are the model's: shown as plain text, indented JSON, never read as markup.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Label, Static

from app.tools.approval import Approval
from app.tools.spec import ToolCall, ToolSpec
from app.tui.screens.dialog import DialogScreen
from app.tui.widgets.tool_block import pretty_arguments

ANSWERS = {"once": Approval.ONCE, "always": Approval.ALWAYS, "no": Approval.NO}


class ToolApprovalScreen(DialogScreen[Approval | None]):
    """Dismissed with the Approval chosen, or None for Esc: stop the reply (the chat then refuses the call)."""

    DEFAULT_CSS = """
    ToolApprovalScreen {
        #dialog {
            width: 80;
            border: thick $warning 60%;
        }
        #question {
            text-style: bold;
        }
        #about {
            color: $text-muted;
            margin: 0 0 1 0;
        }
        #arguments-box {
            height: auto;
            max-height: 16;
            margin: 0 0 1 0;
            background: $boost;
        }
    }
    """

    AUTO_FOCUS = "#once"  # Enter runs it once, as the hint says
    BINDINGS = [
        Binding("y", "answer('once')", "Once", show=False),
        Binding("a", "answer('always')", "Always", show=False),
        Binding("n", "answer('no')", "No", show=False),
        Binding("escape", "stop", "Stop the reply", show=False),
    ]

    def __init__(self, call: ToolCall, tool: ToolSpec | None):
        super().__init__()
        self.call, self.tool = call, tool

    def compose(self) -> ComposeResult:
        server = self.tool.server if self.tool is not None else None
        with Vertical(id="dialog"):
            yield Label(f"Run the tool {self.call.name}?", id="question", markup=False)
            yield Label((f"From the MCP server {server}. " if server else "")
                        + "The model asks to run it with these arguments:", id="about", markup=False)
            with VerticalScroll(id="arguments-box"):
                yield Static(pretty_arguments(self.call.arguments), id="arguments", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Once (y)", id="once", variant="primary")
                yield Button("Always in this chat (a)", id="always")
                yield Button("No (n)", id="no")
            yield Label("Esc stops the reply.", id="stop-hint", markup=False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(ANSWERS[event.button.id])

    def action_answer(self, answer: str) -> None:
        self.dismiss(ANSWERS[answer])

    def action_stop(self) -> None:
        self.dismiss(None)
