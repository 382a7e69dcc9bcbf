"""A yes/no question in a modal box, for actions that cannot be undone (deleting a conversation)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label

from app.tui.screens.dialog import DialogScreen


class ConfirmScreen(DialogScreen[bool]):
    """Dismissed with True (the confirm button, or y) or False (Cancel, n or Esc).

    Cancel has the focus at first, so Enter alone never confirms: a key pressed by habit (d, then
    Enter) must not delete. Enter presses whichever button has the focus; Tab moves to the other."""

    DEFAULT_CSS = """
    ConfirmScreen {
        #dialog {
            border: thick $error 50%;
        }
        #question {
            width: 1fr;
            margin: 0 0 1 0;
        }
    }
    """

    AUTO_FOCUS = "#cancel"
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n,escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, question: str, confirm_label: str = "Delete"):
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(self.question, id="question", markup=False)  # it may quote a title, [ and all
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button(self.confirm_label, id="confirm", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
