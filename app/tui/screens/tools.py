"""/tools: the tools the chat can offer the model, grouped by the MCP server that runs them, each with its
description and a switch; the conversation keeps which ones are off (chat/tool_use.py). Names and
descriptions come from the servers: shown as plain text, never read as markup."""

from __future__ import annotations

from itertools import groupby

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Checkbox, Label, Static

from app.tools.approval import qualified_name
from app.tools.spec import ToolCall, ToolSpec
from app.tui.screens.dialog import DialogScreen

NO_SERVER = "Tools of this program"  # FunctionTools: run by kvchat itself, not by an MCP server


def tool_key(tool: ToolSpec) -> str:
    """"server.tool", as the allow-list and the conversation's choice name a tool (the bare name without one)."""
    return qualified_name(tool, ToolCall(tool.name, {}))


class ToolsScreen(DialogScreen[frozenset[str]]):
    """Dismissed (Esc, or Done) with the keys (tool_key) of the tools switched off."""

    DEFAULT_CSS = """
    ToolsScreen {
        #dialog {
            width: 80;
            max-height: 90%;
        }
        #tools-title {
            text-style: bold;
        }
        #tool-list {
            height: auto;
            max-height: 30;
        }
        .server {
            text-style: bold underline;
            margin: 1 0 0 0;
        }
        .description, #tools-hint {
            color: $text-muted;
        }
        .description {
            padding: 0 0 0 6;
        }
    }
    """

    AUTO_FOCUS = "Checkbox"
    BINDINGS = [Binding("escape", "done", "Done", show=False)]

    def __init__(self, tools: list[ToolSpec], off: frozenset[str]):
        super().__init__()
        self.tools = sorted(tools, key=lambda tool: (tool.server is None, tool.server or "", tool.name))
        self.off = set(off)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label("Tools in this conversation", id="tools-title")
            yield Static("Space switches a tool on or off; the model is offered the ones on from your next message.",
                         id="tools-hint", markup=False)
            with VerticalScroll(id="tool-list"):
                for server, tools in groupby(enumerate(self.tools), key=lambda pair: pair[1].server):
                    yield Static(f"MCP server {server}" if server else NO_SERVER, classes="server", markup=False)
                    for index, tool in tools:
                        yield Checkbox(Content(tool.name), tool_key(tool) not in self.off, id=f"tool-{index}")
                        if tool.description:
                            yield Static(tool.description, classes="description", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Done", id="done", variant="primary")

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        event.stop()
        key = tool_key(self.tools[int(event.checkbox.id.removeprefix("tool-"))])
        if event.value:
            self.off.discard(key)
        else:
            self.off.add(key)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_done()

    def action_done(self) -> None:
        self.dismiss(frozenset(self.off))
