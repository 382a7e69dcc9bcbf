"""StopText: a reply's text cut before the first of its stop strings, as it streams (the API server, where
OpenAI's API leaves the stop text out, and a chat format whose reply ends at the next "User:" line)."""

from __future__ import annotations


class StopText:
    """A reply's text cut before the first of the stop strings; holds back text that may begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""
        self.hit = False

    def push(self, text: str) -> str:
        """The text that is safe to send now."""
        if self.hit:
            return ""
        if not self.stops:
            return text
        self.pending += text
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            out, self.pending = self.pending[: min(found)], ""
            return out
        hold = next((k for k in range(min(max(map(len, self.stops)) - 1, len(self.pending)), 0, -1)
                     if any(s.startswith(self.pending[-k:]) for s in self.stops)), 0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.hit else self.pending), ""
        return out
