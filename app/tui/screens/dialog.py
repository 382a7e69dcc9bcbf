"""DialogScreen: the look every small modal box shares (centred, 60 columns, a coloured border)."""

from __future__ import annotations

from typing import TypeVar

from textual.screen import ModalScreen

Result = TypeVar("Result")


class DialogScreen(ModalScreen[Result]):
    """Put the box's content in a container with id `dialog` (its buttons in one with id `buttons`); a
    subclass may recolour its border."""

    DEFAULT_CSS = """
    DialogScreen {
        align: center middle;

        #dialog {
            width: 60;
            max-width: 90%;
            height: auto;
            padding: 1 2;
            background: $surface;
            border: thick $accent 50%;
        }
        /* A question or notice's buttons: a row at the right. */
        #buttons {
            height: auto;
            align-horizontal: right;
        }
        #buttons > Button {
            margin: 0 0 0 2;
        }
    }
    """
