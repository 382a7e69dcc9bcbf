"""A conversation's branches as the chat makes and shows them: regenerate the last reply, edit a message of
yours and send it again (each a new branch, the old one kept), and ‹ › between a message's versions.
Branches is the chat pane's (pane.py), which hands it the messages' requests; the chat logic is
ChatSession's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual.widgets import Static

from app.chat.errors import USER_FACING_ERRORS
from app.chat.saved.conversation import ConversationChanged
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.messages import MessageView
from app.tui.widgets.prompt_input import PromptInput

if TYPE_CHECKING:
    from app.chat.session import ChatSession
    from app.chat.tool_loop import ToolLoop
    from app.tui.chat.tool_use import ToolUse


@runtime_checkable  # so a test can check that the chat pane keeps it
class BranchesPane(Protocol):
    """What Branches uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: BranchesHost  # the app
    tool_use: ToolUse  # the loop a regenerated reply is written in, when the conversation offers tools

    @property
    def generating(self) -> bool: ...

    def can_send(self, text: str | None = None) -> bool: ...

    async def reload_changed(self) -> None: ...

    async def start_reply(self, events, loop: ToolLoop | None = None) -> None: ...


class BranchesHost(Protocol):
    """What Branches uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None


class Branches:
    """Regenerate, edit and switch branches in the chat; the message being edited, if any (the pane's)."""

    def __init__(self, pane: BranchesPane):
        self.pane = pane
        self.editing: int | None = None  # index of the user message being edited (written here only)

    async def regenerate(self) -> None:
        pane = self.pane
        if not pane.can_send():
            return
        session = pane.host.session
        try:
            loop = pane.tool_use.loop_for(session)  # with tools on, the new reply may call them
            events = loop.regenerate() if loop else session.regenerate()
        except ConversationChanged:
            await pane.reload_changed()
            return
        except USER_FACING_ERRORS as exc:
            pane.notify(str(exc), severity="warning", timeout=10)
            return
        await pane.query_one(ChatView).truncate(len(session.messages))
        await pane.start_reply(events, loop)

    def last_reply_asked(self, view: MessageView) -> bool:
        """Is `view` the last reply (the only one regenerated)? If not, say so."""
        if view.index == len(self.pane.query_one(ChatView).messages) - 1:
            return True
        self.pane.notify("Only the last reply can be regenerated; earlier ones: edit the message before them.",
                         severity="warning", timeout=6)
        return False

    def edit_last(self) -> None:
        messages = self.pane.query_one(ChatView).messages
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            self.pane.notify("There is no message of yours to edit.", severity="warning")
            return
        self.start_editing(users[-1], messages[users[-1]].content)

    def start_editing(self, index: int, text: str) -> None:
        pane = self.pane
        if pane.generating:
            pane.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.editing = index
        banner = pane.query_one("#editing", Static)
        banner.update(f"Editing message {index + 1}: Enter sends it as a new branch (the old one stays, "
                      "‹ › on the message) · Esc cancels")
        banner.display = True
        prompt = pane.query_one(PromptInput)
        prompt.text = text
        prompt.focus()

    def stop_editing(self) -> None:
        self.editing = None
        self.pane.query_one("#editing", Static).display = False

    async def switch(self, event: MessageView.BranchRequested) -> None:
        """‹ › on a message: the conversation goes on from its other version that way."""
        pane = self.pane
        if not pane.can_send():
            return
        view, session = event.view, pane.host.session
        position = view.alternatives.index(view.message.id) + event.step
        if not 0 <= position < len(view.alternatives):
            pane.notify("There is no other version that way.", timeout=3)
            return
        try:
            session.switch_branch(view.alternatives[position])
        except USER_FACING_ERRORS as exc:
            pane.notify(str(exc), severity="error", timeout=10)
            return
        chat = pane.query_one(ChatView)
        await chat.show(session.messages)
        for other in chat.views():
            if other.index == view.index:
                other.focus()
