"""The scrolling list of a conversation's messages.

Opening a long conversation must be instant, and a Markdown widget costs
milliseconds to build, so only the newest PAGE messages are mounted; a button
above them mounts the next PAGE older ones on demand. The view follows a
streaming reply (Textual's anchor) unless the user has scrolled up. Code
blocks keep their lines whole and scroll sideways (Shift+←/→ on a message).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Button, Static
from textual.widgets.markdown import MarkdownFence

from app.chat.session import ChatMessage
from app.tui.widgets.messages import AssistantMessageView, MessageView, NoteView, UserMessageView
from app.tui.widgets.summary_view import SummaryMessageView
from app.tui.widgets.tool_block import ToolMessageView

PAGE = 20  # about two screens of messages; building a Markdown widget costs milliseconds

WELCOME = ("Type a message and press Enter.  Ctrl+J adds a line · Esc stops a reply · "
           "Ctrl+B conversations · Ctrl+O settings · Ctrl+T inspector · /help or F1: all keys and commands")


class ChatView(VerticalScroll):
    # On a message: its code blocks scroll sideways (their long lines are not wrapped).
    BINDINGS = [Binding("shift+left", "scroll_code(-1)", "Scroll its code blocks left", show=False),
                Binding("shift+right", "scroll_code(1)", "Scroll its code blocks right", show=False)]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.messages: list[ChatMessage] = []
        self.first_shown = 0  # index of the oldest mounted message
        self.alternatives: Callable[[ChatMessage], list[str]] = lambda message: []
        # One change of the list at a time: a `show` (the conversation opened, or shown again) removes every
        # view, so a reply view added while it ran lost its children under the stream writing into it (seen
        # under load, right after a resume from Ctrl+Z), and its message left `messages`.
        self._changing = asyncio.Lock()

    def on_mount(self) -> None:
        self.anchor()

    def _view(self, message: ChatMessage, index: int) -> MessageView:
        cls = {"user": UserMessageView, "system": SummaryMessageView, "tool": ToolMessageView}.get(
            message.role, AssistantMessageView)
        return cls(message, index, self.alternatives(message) if message.id else [])

    async def show(self, messages: list[ChatMessage], welcome: str | None = WELCOME) -> None:
        """Replace everything with `messages` (the newest PAGE of them)."""
        async with self._changing:
            await self._show(messages, welcome)

    async def _show(self, messages: list[ChatMessage], welcome: str | None) -> None:
        self.messages = list(messages)
        self.first_shown = max(0, len(messages) - PAGE)
        await self.remove_children()
        widgets: list = [self._more_button()] if self.first_shown else []
        widgets += [self._view(m, i) for i, m in enumerate(messages) if i >= self.first_shown]
        if not messages and welcome:
            widgets.append(Static(welcome, id="welcome", markup=False))
        await self.mount_all(widgets)
        self.scroll_end(animate=False)
        self.anchor()

    def _more_button(self) -> Button:
        return Button(f"▲ {self.first_shown} earlier messages", id="earlier", compact=True)

    async def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "earlier":
            return
        event.stop()
        start = max(0, self.first_shown - PAGE)
        views = [self._view(self.messages[i], i) for i in range(start, self.first_shown)]
        self.first_shown = start
        await event.button.remove()
        first = self.query_children(MessageView).first() if self.query_children(MessageView) else None
        await self.mount_all(views, before=first)
        if start:
            await self.mount(self._more_button(), before=views[0])

    async def truncate(self, index: int) -> None:
        """Remove the messages from `index` on (a regenerated reply, an edited message)."""
        async with self._changing:
            self.messages = self.messages[:index]
            for view in list(self.query_children(MessageView)):
                if view.index >= index:
                    await view.remove()

    async def add(self, message: ChatMessage) -> MessageView | None:
        """`message` shown last; its view, or None when the chat is quitting: once Textual's shutdown has
        begun it mounts nothing (a view added then has no parts), which Ctrl+Q right after Enter met."""
        async with self._changing:
            if not (self.app.is_running and self.is_attached):
                return None
            view = await self._add(message)
            return view if view.is_mounted and self.app.is_running else None

    async def _add(self, message: ChatMessage) -> MessageView:
        for welcome in self.query("#welcome"):
            await welcome.remove()
        self.messages.append(message)
        view = self._view(message, len(self.messages) - 1)
        await self.mount(view)
        self.anchor()
        return view

    async def add_note(self, text: str) -> None:
        await self.mount(NoteView(text))

    def action_scroll_code(self, step: int) -> None:
        """Scroll the focused message's code blocks that are wider than the chat, half a width a step."""
        focused = self.app.focused
        fences = [fence for fence in focused.query(MarkdownFence) if fence.max_scroll_x] \
            if isinstance(focused, MessageView) else []
        if not fences:
            raise SkipAction()  # the keys keep whatever else they do there
        for fence in fences:
            fence.scroll_relative(x=step * max(fence.size.width // 2, 1), animate=False)

    def views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    def last_reply(self) -> AssistantMessageView | None:
        replies = list(self.query_children(AssistantMessageView))
        return replies[-1] if replies else None
