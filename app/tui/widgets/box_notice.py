"""The line under the message box that says why what was just typed was not taken: a refused slash
command, a message too long for the context window, a file that cannot be attached, a refused paste.

Such a sentence belongs next to the text it is about, not in the stack of toasts, where a later notice
(a /model switch, a finished export) hid it. It stays until the box is edited (the app clears it then);
toasts are kept for events.
"""

from __future__ import annotations

from textual.widgets import Static


class BoxNotice(Static):
    """One sentence about the message box's text, shown under it; hidden when there is none."""

    DEFAULT_CSS = """
    BoxNotice {
        display: none;
        height: auto;
        padding: 0 1;
        color: $text-error;
    }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__("", markup=False, id=id)  # the sentence may quote what the user typed, [ and all
        self.sentence = ""
        self.about = ""  # the box's text the sentence is about

    def say(self, sentence: str, about: str) -> None:
        self.sentence, self.about = sentence, about
        self.update(sentence)
        self.display = True

    def box_changed(self, text: str) -> None:
        """The box now holds `text`: once it is not the text the sentence was about, the sentence goes.
        (A change reported late, for the text the sentence is about, leaves it.)"""
        if self.sentence and text != self.about:
            self.sentence = self.about = ""
            self.update("")
            self.display = False
