"""The notice shown when the next message no longer fits the context window: two ways on, each a new
branch of the conversation (the one shown stays saved as it is), or neither (the message stays in the box)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label

from app.tui.screens.dialog import DialogScreen

DROP_OLDEST, COMPACT = "drop-oldest", "compact"


class ContextFullScreen(DialogScreen["str | None"]):
    """Dismissed with DROP_OLDEST (its button, or d), COMPACT (its button, or c) or None (Cancel or Esc).
    Cancel has the focus at first, so an Enter pressed by habit changes nothing."""

    DEFAULT_CSS = """
    ContextFullScreen {
        #dialog {
            border: thick $warning 50%;
        }
        #notice {
            width: 1fr;
            margin: 0 0 1 0;
        }
    }
    """

    AUTO_FOCUS = "#cancel"
    BINDINGS = [
        Binding("d", f"choose('{DROP_OLDEST}')", "Drop the oldest turns", show=False),
        Binding("c", f"choose('{COMPACT}')", "Compact", show=False),
        Binding("escape", "choose(None)", "Cancel", show=False),
    ]

    def __init__(self, notice: str):
        super().__init__()
        self.notice = notice

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(f"{self.notice}\n\nd: drop the oldest turns (the system prompt and the latest turns stay)\n"
                        "c: compact (the model summarizes the earlier turns)\n"
                        "Either goes on on a new branch; this one stays saved as it is (‹ › on the first message).",
                        id="notice", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Drop oldest (d)", id=DROP_OLDEST, variant="warning")
                yield Button("Compact (c)", id=COMPACT, variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, way: str | None) -> None:
        self.dismiss(way)
