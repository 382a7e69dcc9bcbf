"""Single-letter keys on widgets that are not for typing: a message (c, k, e, r, ‹ ›) and the
conversation list (n, r, d, /).

A user whose focus landed there by a click, Tab or Ctrl+B is usually still typing, so those
letters must not rename or delete anything. The app decides when they act (the chat app: once the
user moved there with the arrow keys; until then it sends printable keys to the message box) and
says so through `letters_act(widget)`; a widget tested without such an app always lets them act.
"""

from __future__ import annotations

from textual.widget import Widget

# Keys that move around messages or conversations: pressing one there is navigating, not typing.
NAVIGATION_KEYS = frozenset({"up", "down", "left", "right", "home", "end", "pageup", "pagedown"})


def letters_act(widget: Widget) -> bool | None:
    """True if `widget`'s single-letter bindings act now; None (shown dimmed in the footer) if
    the app holds them back until the user navigates there. For a widget's check_action()."""
    decide = getattr(widget.app, "letters_act", None)
    return True if decide is None or decide(widget) else None
