"""One line of text asked in a modal box: a conversation's new title, a file to export to."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Label

from app.tui.screens.dialog import DialogScreen

EMPTY_HINT = "Type a name, or Esc to cancel."


class TextPromptScreen(DialogScreen[str | None]):
    """Dismissed with the typed text, stripped (Enter), or None (Esc). Enter on an empty line
    keeps the box open and says what to do instead."""

    DEFAULT_CSS = """
    TextPromptScreen {
        #title {
            text-style: bold;
            margin: 0 0 1 0;
        }
        #hint {
            color: $warning;
            height: 1;
        }
        #keys {
            color: $text-muted;
        }
    }
    """

    AUTO_FOCUS = "#value"
    BINDINGS = [Binding("escape", "cancel", "Cancel", show=False)]

    def __init__(self, title: str, value: str = "", placeholder: str = ""):
        super().__init__()
        self.prompt_title = title
        self.value = value
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.prompt_title, id="title", markup=False)
            yield Input(self.value, placeholder=self.placeholder, id="value")
            yield Label("", id="hint")
            yield Label("Enter saves · Esc cancels", id="keys")

    @on(Input.Submitted, "#value")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if text:
            self.dismiss(text)
        else:
            self.query_one("#hint", Label).update(EMPTY_HINT)

    @on(Input.Changed, "#value")
    def _changed(self, event: Input.Changed) -> None:
        if event.value.strip():  # the hint has been heeded
            self.query_one("#hint", Label).update("")

    def action_cancel(self) -> None:
        self.dismiss(None)
