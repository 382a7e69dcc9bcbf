"""F1: every key of the app, grouped by where it works, read from the bindings themselves
(so the help can never disagree with what the keys do)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static
from rich.table import Table
from rich.text import Text


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 76; max-height: 90%; height: auto;
        border: round $accent; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; padding: 0 0 1 0; }
    HelpScreen #help-hint { color: $text-muted; padding: 1 0 0 0; }
    """
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, sections: list[tuple[str, list[Binding]]]):
        """`sections`: (where the keys work, their bindings); bindings without a description are left out."""
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("kvchat keys", id="help-title")
            yield Static(self.table(), id="help-keys")
            yield Static("Ctrl+P opens the command palette: every action, searchable. Esc closes this.",
                         id="help-hint")

    def table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(justify="right", style="bold", min_width=14)
        table.add_column()
        for title, bindings in self.sections:
            rows = [(self.key_names(b), b.description) for b in bindings if b.description]
            if not rows:
                continue
            table.add_row(Text(title, style="italic underline"), "")
            for keys, description in rows:
                table.add_row(keys, description)
            table.add_row("", "")
        return table

    def key_names(self, binding: Binding) -> str:
        return " / ".join(self.app.get_key_display(Binding(key, binding.action))
                          for key in binding.key.split(","))
