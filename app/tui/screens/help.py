"""F1: every key of the app and every slash command, grouped by where they work, read from the
bindings and the command table themselves (so the help can never disagree with what they do)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from app.tui import slash_commands
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import AssistantMessageView, MessageView, UserMessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.tool_block import ToolMessageView

HELP_NOTE = ("Typing goes to the message box wherever the focus is. On a message or in the conversation list, "
             "the letter keys act once you have moved there with the arrow keys (or Ctrl+↑); Esc always "
             "comes back to the box.")

# One row: a binding (its keys and its tooltip or description), or (what to type, what it does).
Row = Binding | tuple[str, str]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 78; max-width: 100%; max-height: 100%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; }
    HelpScreen .help-note { color: $text-muted; padding: 1 0 0 0; }
    """
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list[Row]]], notes: Sequence[str] = ()):
        """`sections`: (where the keys work, their rows); bindings without a description are left out.
        `notes`: sentences shown above the keys."""
        super().__init__()
        self.sections = sections
        self.notes = list(notes)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("kvchat keys", id="help-title")
            for note in self.notes:
                yield Static(note, classes="help-note", markup=False)
            yield Static(self.keys(), id="help-keys")
            yield Static("Ctrl+P opens the command palette: every action, searchable. Esc closes this.",
                         classes="help-note")

    def rows(self) -> list[tuple[str, str, str]]:
        """(section title, keys, what they do) of every row shown, top to bottom."""
        shown = []
        for title, rows in self.sections:
            for row in rows:
                if isinstance(row, Binding):
                    if row.description:
                        shown.append((title, self.key_names(row), row.tooltip or row.description))
                else:
                    shown.append((title, *row))
        return shown

    def keys(self) -> Group:
        """Each section's title on a line of its own (it never wraps into the keys' column), then its
        rows: the keys right-aligned in one column as wide as the widest keys of all sections."""
        rows = self.rows()
        width = max((len(keys) for _, keys, _ in rows), default=0)
        parts: list = []
        for title in dict.fromkeys(title for title, _, _ in rows):
            parts.append(Text(f"\n{title}", style="bold underline"))
            table = Table.grid(padding=(0, 2))
            table.add_column(justify="right", style="bold", width=width)
            table.add_column(ratio=1)
            for _, keys, description in (row for row in rows if row[0] == title):
                table.add_row(keys, description)
            parts.append(table)
        return Group(*parts)

    def key_names(self, binding: Binding) -> str:
        return " / ".join(self.app.get_key_display(Binding(key, binding.action))
                          for key in binding.key.split(","))


def chat_help(anywhere: list[Binding]) -> HelpScreen:
    """The chat app's help: `anywhere` (the app's own bindings), the keys of each place, and the slash
    commands."""
    letters = "letters act after an arrow key"
    commands = [(slash_commands.usage(name), does) for name, (_, does) in slash_commands.COMMANDS.items()]
    commands.append((f"{slash_commands.ESCAPE}TEXT", "Send a message that starts with a single /"))
    sections = [("Anywhere", anywhere), ("In the message box", PromptInput.HELP_BINDINGS),
                ("Slash commands, typed at the start of the box", commands),
                (f"On a message (Ctrl+↑ to reach one; {letters})", [*MessageView.BINDINGS, *ChatView.BINDINGS]),
                ("On your message", UserMessageView.BINDINGS), ("On a reply", AssistantMessageView.BINDINGS),
                ("On a tool call (⚙)", ToolMessageView.BINDINGS),
                (f"In the conversation list (Ctrl+B; {letters})", Sidebar.BINDINGS)]
    return HelpScreen(sections, [HELP_NOTE])
