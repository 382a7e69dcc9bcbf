"""`kvchat ask` on a conversation that no longer fits the context window: refused in one sentence naming
--drop-oldest and --compact, or, with one of them, answered on a new branch (the old one stays as it is);
--json then says what was left out or compacted and where the old branch ends."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from app.chat.errors import ChatError
from app.chat.terminal_text import say

if TYPE_CHECKING:
    from app.chat.session import ChatSession
    from engine import Event, RequestStats


class OverflowWay:
    """How this ask goes on if its message does not fit; what it did, for --json and stderr."""

    def __init__(self, args: argparse.Namespace):
        self.drop_oldest = getattr(args, "drop_oldest", False)
        self.compact = getattr(args, "compact", False)
        self.taken: dict | None = None  # None: the message fitted, nothing was dropped or compacted
        self._report: Callable[[RequestStats | None], str] | None = None

    def send(self, session: ChatSession, message: str) -> Iterator[Event]:
        """The reply's events: to `message` after the conversation, or on a new branch when it does not fit
        and a flag says how. ChatError naming the flags when it does not fit and none was given."""
        from app.chat.prompt.context_room import ConversationTooLong

        try:
            return session.send(message)
        except ConversationTooLong as exc:
            if not (self.drop_oldest or self.compact):
                raise ChatError(f"This conversation is {exc.prompt_tokens:,} tokens with your message and the reply "
                                f"needs {exc.room:,} more, over the model's context window of {exc.context_window:,} "
                                "tokens; ask again with --drop-oldest (leave out the oldest turns) or --compact (the "
                                "model summarizes them), either of which answers on a new branch and keeps this "
                                "one as it is.") from None
        previous_leaf = session.saved.leaf if session.saved else None
        events = self._drop_oldest(session, message) if self.drop_oldest else self._compacted(session, message)
        self.taken["previous_leaf"] = previous_leaf  # where the branch as it was ends
        self.taken["branch_root"] = session.messages[0].id  # the new branch's first message
        return events

    def _drop_oldest(self, session: ChatSession, message: str) -> Iterator[Event]:
        from app.chat.context.overflow import drop_report, send_dropping_oldest

        plan, events = send_dropping_oldest(session, message)
        self.taken = {"way": "drop-oldest", "dropped_messages": len(plan.dropped),
                      "dropped_tokens": plan.dropped_tokens, "kept_messages": len(plan.kept)}
        self._report = lambda stats: drop_report(plan, stats)
        return events

    def _compacted(self, session: ChatSession, message: str) -> Iterator[Event]:
        from app.chat.context.compaction import compact, compact_report, send_compacted

        say("compacting the conversation (the model summarizes it)…")
        summary = compact(session, message)
        events = send_compacted(session, summary, message)
        self.taken = {"way": "compact", "summarized_messages": summary.summarized,
                      "summary_tokens": summary.generated_tokens, "summary_passes": summary.passes,
                      "summary_finish_reason": summary.finish_reason}
        self._report = lambda stats: compact_report(summary)
        return events

    def report(self, stats: RequestStats | None) -> str | None:
        """One sentence for stderr after the reply, or None when nothing was dropped or compacted."""
        return self._report(stats) if self._report is not None else None
