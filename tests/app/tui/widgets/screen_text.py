"""What a running app's screen shows, as lines of plain text (the cells a user sees, no colours)."""

from __future__ import annotations

import io

from rich.console import Console


def screen_lines(app) -> list[str]:
    """The current screen, one string per terminal row."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text().splitlines()[:height]
