"""A reply's reasoning (a reasoning model's `<think>` block, app/chat/prompt/thinking.py), shown dimmed above
its answer: one line when collapsed, the whole text when expanded. `t` on the reply, or a click on
the block, toggles it.

While the reasoning streams in, the block is expanded (unless the chat's `collapse_thinking` setting
says otherwise); it collapses when the answer begins, unless the user has toggled it meanwhile.
"""

from __future__ import annotations

from textual import events
from textual.widgets import Static


class ThinkingBlock(Static):
    DEFAULT_CSS = """
    ThinkingBlock {
        color: $text-muted;
        text-style: italic;
        padding: 0 0 0 1;
        border-left: solid $accent 30%;
    }
    """

    def __init__(self, reasoning: str | None, tokens: int | None = None, ended: bool = True):
        """`reasoning`: the text (None: the reply has none, and the block is hidden); `tokens`: how many
        it took (None: not known); `ended`: its closing tag came (False: the reply stopped inside it)."""
        super().__init__("", markup=False, classes="thinking")
        self.reasoning = reasoning or ""
        self.tokens = tokens
        self.ended = ended
        self.expanded = False
        self.streaming = False
        self.toggled = False  # by the user, while it streamed: then it is left as they want it

    def on_mount(self) -> None:
        self.redraw()

    def begin(self, expanded: bool) -> None:
        """The reply is being written and its reasoning may stream in."""
        self.streaming, self.expanded, self.ended = True, expanded, False

    def add(self, text: str) -> None:
        """More of the reasoning, as it streams."""
        self.reasoning += text
        self.redraw()

    def answer_began(self) -> None:
        self.ended = True
        if self.streaming and not self.toggled:
            self.expanded = False
        self.redraw()

    def finish(self, reasoning: str | None, tokens: int | None, ended: bool) -> None:
        """The reply ended: its reasoning as stored (whitespace trimmed), collapsed unless the user opened it."""
        self.reasoning, self.tokens, self.ended = reasoning or "", tokens, ended
        if not self.toggled:
            self.expanded = False
        self.streaming = False
        self.redraw()

    def toggle(self) -> None:
        self.expanded = not self.expanded
        self.toggled = self.toggled or self.streaming
        self.redraw()

    def heading(self) -> str:
        """"▸ thinking · 120 tokens · t shows it": what the block says of itself."""
        words = ["thinking…" if self.streaming and not self.ended else "thinking"]
        if self.tokens is not None:
            words.append(f"{self.tokens:,} tokens")
        if not self.ended and not self.streaming:
            words.append("stopped before its answer")
        words.append("t hides it" if self.expanded else "t shows it")
        return ("▾ " if self.expanded else "▸ ") + " · ".join(words)

    def redraw(self) -> None:
        self.display = bool(self.reasoning.strip())
        body = self.reasoning.strip() if self.expanded else ""
        self.update(self.heading() + (f"\n{body}" if body else ""))

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.toggle()
