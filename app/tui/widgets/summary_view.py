"""The summary a compacted branch starts from (app/chat/context/compaction.py): drawn as the model's text, named as
what it is; it is not a reply, so it is not regenerated."""

from __future__ import annotations

from app.tui.widgets.messages import AssistantMessageView


class SummaryMessageView(AssistantMessageView):
    def who(self) -> str:
        return "summary of the earlier turns (compacted; ‹ › here leads back to them)"

    def action_regenerate(self) -> None:
        self.notify("A summary is not regenerated; the branch it compacted is still there (‹ ›).", timeout=6)

    def action_regenerate_alternatives(self) -> None:
        self.action_regenerate()
