"""Message bubbles of the chat view."""

from __future__ import annotations

from textual.widgets import Markdown, Static


class UserMessage(Static):
    """What the user sent, shown as typed (no Markdown interpretation)."""

    def __init__(self, text: str):
        super().__init__(text, markup=False)


class AssistantMessage(Markdown):
    """A reply; streamed while it is generated, rendered whole at the end."""
