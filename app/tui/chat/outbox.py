"""A message typed in the box, on its way out: sent to the conversation (or refused, and given back to the
box), or queued while a reply is written and sent when that reply ends by itself. Outbox is the chat
pane's (pane.py), whose Enter hands it a message (slash commands go to commands.py instead); the pane keeps
what the others use too: whether a message can be sent now, and giving one back to the box."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.chat.errors import USER_FACING_ERRORS
from app.chat.prompt.context_room import ConversationTooLong
from app.chat.saved.conversation import ConversationChanged
from app.tui import slash_commands
from app.tui.widgets.chat_view import ChatView
from app.tui.widgets.prompt_input import PromptInput
from engine import ContextWindowError

if TYPE_CHECKING:
    from app.chat.session import ChatSession
    from app.chat.tool_loop import ToolLoop
    from app.tui.chat.branches import Branches
    from app.tui.chat.overflow import WaysOn
    from app.tui.chat.tool_use import ToolUse


@runtime_checkable  # so a test can check that the chat pane keeps it
class OutboxPane(Protocol):
    """What Outbox uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: OutboxHost  # the app
    editing: int | None  # the index of the user message being edited: the message is its new branch
    branches: Branches
    tool_use: ToolUse  # the loop the message's replies are written in, when the conversation offers tools
    ways_on: WaysOn  # a message that does not fit

    @property
    def generating(self) -> bool: ...

    def can_send(self, text: str | None = None) -> bool: ...

    def give_back(self, typed: str, sentence: str = "", severity: str = "warning") -> None: ...

    async def reload_changed(self) -> None: ...

    async def start_reply(self, events, loop: ToolLoop | None = None) -> None: ...


class OutboxHost(Protocol):
    """What Outbox uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None


class Outbox:
    """Sends the messages typed in the box, and the one queued while a reply is written (the chat pane's)."""

    def __init__(self, pane: OutboxPane):
        self.pane = pane

    async def send(self, text: str, typed: str) -> None:
        pane = self.pane
        if not pane.can_send(typed):
            pane.give_back(typed)
            return
        session, editing = pane.host.session, pane.editing
        try:
            loop = pane.tool_use.loop_for(session)
            if editing is None:
                events = loop.send(text) if loop else session.send(text)
            else:
                events = loop.run(session.edit(editing, text)) if loop else session.edit(editing, text)
        except ConversationChanged:
            pane.give_back(typed)
            await pane.reload_changed()
            return
        except ConversationTooLong as exc:  # it would fit after fewer turns: the ways on (overflow.py)
            pane.give_back(typed)
            pane.ways_on.offer(exc)
            return
        except ContextWindowError as exc:
            pane.give_back(typed, f"{exc} Ctrl+L clears the box; /clear starts a new chat.", "error")
            return
        except (*USER_FACING_ERRORS, ValueError) as exc:
            pane.give_back(typed, str(exc), "error")
            return
        pane.query_one(PromptInput).remember(typed)
        pane.branches.stop_editing()
        chat = pane.query_one(ChatView)
        if editing is not None:
            await chat.truncate(editing)
        await chat.add(session.messages[-1])
        await pane.start_reply(events, loop)

    # ---- the message queued while a reply is written (sent when it ends; see PromptInput.queue)

    def queue(self, typed: str) -> None:
        prompt = self.pane.query_one(PromptInput)
        if prompt.queued is not None:  # one at a time: the first is shown, this one stays in the box
            self.pane.give_back(typed, "A message is already queued; Backspace in the empty box takes it back.")
            return
        prompt.queue(typed)

    def take_back_queued(self) -> None:
        """The queued message returns to the box to be edited (or, if the box has new text, to the history)."""
        text = self.pane.query_one(PromptInput).take_queued()
        if text is not None:
            self.pane.give_back(text)

    async def reply_ended(self, clean: bool) -> None:
        """A reply (or N alternatives) ended: the queued message goes out if it ended by itself; one stopped
        or failed gives it back to the box instead."""
        pane = self.pane
        if pane.generating or pane.query_one(PromptInput).queued is None:
            return
        if not clean:
            self.take_back_queued()
            return
        typed = pane.query_one(PromptInput).take_queued()
        text = slash_commands.parse(typed)
        await self.send(text if isinstance(text, str) else typed, typed)
