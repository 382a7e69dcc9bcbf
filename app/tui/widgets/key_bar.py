"""The key bar at the bottom: Textual's Footer, showing only the keys that fit whole.

Textual's Footer lays every key out in a row and lets the last ones run under the palette key on the
right, cut mid-word ("^t Inspe▏" at 80 columns). This one keeps the keys in the order the app lists
them (what a newcomer needs first comes first) and leaves out, whole, those that do not fit.
"""

from __future__ import annotations

from rich.cells import cell_len
from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

# A key's cells besides its key and description: one space each side of the key, one after the
# description (Footer's non-compact style). The palette key, docked right, adds its left border and
# right padding.
KEY_PADDING = 3
PALETTE_EXTRA = 2


def key_cells(key: FooterKey) -> int:
    """The cells `key` takes in the bar."""
    extra = KEY_PADDING + (PALETTE_EXTRA if key.has_class("-command-palette") else 0)
    return cell_len(key.key_display) + cell_len(key.description) + extra


def keys_that_fit(widths: list[int], width: int) -> int:
    """How many of the keys `widths` (cells each, in order) fit in `width` cells, all whole."""
    used = 0
    for count, cells in enumerate(widths):
        used += cells
        if used > width:
            return count
    return len(widths)


class KeyBar(Footer):
    """A Footer that shows fewer keys rather than a cut one."""

    _composed_for = 0  # the width the keys were chosen for

    def compose(self) -> ComposeResult:
        keys = list(super().compose())  # kvchat's bindings have no groups: FooterKeys only
        palette = [key for key in keys if key.has_class("-command-palette")]
        others = [key for key in keys if key not in palette]
        self._composed_for = width = self.size.width or self.app.size.width
        room = width - sum(key_cells(key) for key in palette)
        yield from others[:keys_that_fit([key_cells(key) for key in others], room)]
        yield from palette

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._composed_for:
            self.call_after_refresh(self.recompose)
