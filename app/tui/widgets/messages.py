"""One message of the chat view: who said it, which branch it is on, its text, and (replies) its numbers.

A message can be focused (click, Tab, Ctrl+Up, or up/down from another message);
the keys on it copy it, switch between its alternatives (edits of a user message,
regenerations of a reply), edit it or regenerate it (once, or N alternatives at once).
Its single-letter keys act only when the app says so (see letter_keys.py). The view only asks: the app
decides what those requests do.
"""

from __future__ import annotations

import re

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Markdown, Static

from app.chat.reply.stats import ReplyNumbers
from app.chat.session import ChatMessage
from app.chat.prompt.thinking import ReplyParts, stored_reply_parts
from app.chat.wording import counted
from app.tools.messages import calls_of
from app.tui.widgets.letter_keys import letters_act
from app.tui.widgets.thinking_block import ThinkingBlock

STATUS_NOTES = {"stopped": "stopped", "interrupted": "interrupted", "streaming": "still being written"}
_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def last_code_block(markdown: str) -> str | None:
    """The text inside the last fenced code block of `markdown` (an unclosed last fence counts,
    as a reply stopped mid-block has one); None if it has none."""
    closed = list(_FENCE.finditer(markdown))
    blocks = [match.group(2) for match in closed]
    closed_end = closed[-1].end() if closed else 0
    tail = re.search(r"^(```|~~~)[^\n]*\n(.*)\Z", markdown[closed_end:], re.MULTILINE | re.DOTALL)
    if tail:
        blocks.append(tail.group(2))
    return blocks[-1].rstrip("\n") if blocks else None


class MessageView(Vertical, can_focus=True):
    """A message: a header line and its text. `index` is its position in the conversation's branch."""

    BINDINGS = [
        Binding("c", "copy", "Copy"),
        Binding("k", "copy_code", "Copy code"),
        Binding("left,less_than_sign", "branch(-1)", "‹ Branch"),
        Binding("right,greater_than_sign", "branch(1)", "Branch ›"),
        Binding("up", "neighbour(-1)", "Previous", show=False),
        Binding("down", "neighbour(1)", "Next", show=False),
    ]

    # Actions bound to a plain letter (or ‹ ›); ← and → of "branch" are navigation keys, which
    # the app counts as navigating before the binding runs, so they always act.
    LETTER_ACTIONS = frozenset({"copy", "copy_code", "branch", "edit", "regenerate", "regenerate_alternatives",
                                "toggle_thinking"})

    class BranchRequested(Message):
        """Show the message's previous (-1) or next (+1) alternative."""

        def __init__(self, view: MessageView, step: int):
            super().__init__()
            self.view, self.step = view, step

    def __init__(self, message: ChatMessage, index: int, alternatives: list[str] | None = None):
        super().__init__(classes=message.role)
        self.message = message
        self.index = index
        self.alternatives = alternatives or []  # ids of this message and its siblings, oldest first

    @property
    def text(self) -> str:
        return self.message.content

    def compose(self) -> ComposeResult:
        yield Static(self.header_text(), classes="header", markup=False)
        yield self.make_body()

    def make_body(self) -> Static | Markdown:
        raise NotImplementedError

    def who(self) -> str:
        raise NotImplementedError

    def header_text(self) -> str:
        parts = [self.who()]
        if self.branch_text():
            parts.append(self.branch_text())
        if self.message.status in STATUS_NOTES:
            parts.append(STATUS_NOTES[self.message.status])
        return " · ".join(parts)

    def branch_text(self) -> str:
        """"‹ 2/3 ›": which of its alternatives it is ("" if it has none)."""
        if len(self.alternatives) > 1 and self.message.id in self.alternatives:
            return f"‹ {self.alternatives.index(self.message.id) + 1}/{len(self.alternatives)} ›"
        return ""

    def refresh_header(self) -> None:
        for header in self.query(".header"):  # none once the view is gone (the app quit mid-update)
            header.update(self.header_text())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return letters_act(self) if action in self.LETTER_ACTIONS else True

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify(f"Copied the message ({len(self.text):,} characters).", timeout=3)

    def action_copy_code(self) -> None:
        code = last_code_block(self.text)
        if code is None:
            self.notify("This message has no code block.", severity="warning", timeout=3)
            return
        self.app.copy_to_clipboard(code)
        self.notify(f"Copied the code block ({counted(len(code.splitlines()), 'line')}).", timeout=3)

    def action_branch(self, step: int) -> None:
        if len(self.alternatives) < 2:
            self.notify("This message has no other versions.", timeout=3)
            return
        self.post_message(self.BranchRequested(self, step))

    def action_neighbour(self, step: int) -> None:
        views = list(self.parent.query_children(MessageView)) if self.parent else []
        position = views.index(self) + step if self in views else -1
        if 0 <= position < len(views):
            views[position].focus()
            views[position].scroll_visible()
        elif step > 0:
            self.app.query_one("#prompt").focus()


class UserMessageView(MessageView):
    """What the user sent, shown as typed (no Markdown interpretation)."""

    BINDINGS = [Binding("e", "edit", "Edit & resend")]

    class EditRequested(Message):
        def __init__(self, view: UserMessageView):
            super().__init__()
            self.view = view

    def who(self) -> str:
        return "you"

    def make_body(self) -> Static:
        return Static(self.message.content, classes="body", markup=False)

    def action_edit(self) -> None:
        self.post_message(self.EditRequested(self))


class AssistantMessageView(MessageView):
    """A reply: streamed as Markdown while it is generated, rendered whole at the end. A reasoning
    model's thinking (app/chat/prompt/thinking.py) is kept out of the Markdown: it is the ThinkingBlock above."""

    BINDINGS = [Binding("r", "regenerate", "Regenerate"),
                Binding("R", "regenerate_alternatives", "Regenerate N alternatives", show=False),
                Binding("t", "toggle_thinking", "Show / hide its thinking", show=False,
                        tooltip="Show or hide a reasoning model's thinking above the answer")]

    class RegenerateRequested(Message):
        def __init__(self, view: AssistantMessageView):
            super().__init__()
            self.view = view

    class AlternativesRequested(Message):
        """Write N alternatives of this reply at once (N: the settings)."""

        def __init__(self, view: AssistantMessageView):
            super().__init__()
            self.view = view

    # While N alternatives are written in this view: (the one shown, N); its ‹ › browse them.
    choice: tuple[int, int] | None = None

    def who(self) -> str:
        stats = self.message.stats
        summary = ReplyNumbers.from_saved(stats).summary() if stats else ""
        return "assistant" + (f" · {summary}" if summary else "")

    @property
    def parts(self) -> ReplyParts:
        """The message's thinking and answer."""
        return stored_reply_parts(self.message.content, self.message.stats)

    def compose(self) -> ComposeResult:
        parts = self.parts
        yield Static(self.header_text(), classes="header", markup=False)
        yield ThinkingBlock(parts.thinking, _thinking_tokens(self.message.stats), parts.thinking_ended)
        yield self.make_body()

    def make_body(self) -> Markdown:
        body = Markdown(self.parts.answer, classes="body")
        body.display = bool(self.parts.answer) or not self.calls_tools  # its calls are the blocks after it
        return body

    @property
    def calls_tools(self) -> bool:
        """The reply called tools (each call a block after it: tool_block.py)."""
        return bool(calls_of(self.message.tools))

    @property
    def body(self) -> Markdown:
        return self.query_one(".body", Markdown)

    @property
    def thinking(self) -> ThinkingBlock:
        return self.query_one(ThinkingBlock)

    @property
    def text(self) -> str:
        """The answer (what Copy copies; the thinking stays out of it)."""
        return self.body.source if self.is_mounted else self.parts.answer

    def action_toggle_thinking(self) -> None:
        if not self.thinking.reasoning.strip():
            self.notify("This reply has no thinking.", timeout=3)
            return
        self.thinking.toggle()

    def branch_text(self) -> str:
        if self.choice is None:
            return super().branch_text()
        shown, count = self.choice
        return f"alternative ‹ {shown + 1}/{count} ›"

    def action_branch(self, step: int) -> None:
        if self.choice is None:
            super().action_branch(step)
        else:  # the alternatives being written: the app shows the one asked for
            self.post_message(self.BranchRequested(self, step))

    def action_regenerate(self) -> None:
        self.post_message(self.RegenerateRequested(self))

    def action_regenerate_alternatives(self) -> None:
        self.post_message(self.AlternativesRequested(self))

    async def finish(self, message: ChatMessage, alternatives: list[str]) -> None:
        """The reply ended: one full render (streamed code fences can be left half-drawn), then the header."""
        self.message, self.alternatives = message, alternatives
        parts = self.parts
        body = self.body
        body.display = bool(parts.answer) or not self.calls_tools
        await body.update(parts.answer or ("*(no answer)*" if parts.thinking else "*(no reply)*"))
        self.thinking.finish(parts.thinking, _thinking_tokens(message.stats), parts.thinking_ended)
        self.refresh_header()


def _thinking_tokens(stats: dict | None) -> int | None:
    value = stats.get("thinking_tokens") if stats else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class NoteView(Static):
    """A line about the conversation itself (model or system prompt changed), not a message."""

    def __init__(self, text: str):
        super().__init__(text, markup=False)
