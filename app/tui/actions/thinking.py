"""`/thinking on|off`: a conversation's thinking switch (ChatSession.set_thinking), for a reasoning model
whose chat template reads `enable_thinking`. A mixin of KvchatApp, beside ReplyActions' commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.chat.errors import ChatError
from app.tui import slash_commands
from app.tui.slash_commands import CommandError
from storage.errors import StorageError

if TYPE_CHECKING:
    from textual.app import App

    from app.chat.session import ChatSession

    class _Host(App):
        session: ChatSession | None

        @property
        def generating(self) -> bool: ...
else:
    _Host = object


class ThinkingActions(_Host):
    async def _command_thinking(self, argument: str) -> bool:
        """True once switched; CommandError (one sentence) when it cannot be, or for a bare /thinking,
        which says how it is."""
        session = self.session
        if session is None:
            raise CommandError("Thinking can be switched once the model and the conversation are ready.")
        if not argument:
            state = "on" if session.thinking else "off"
            allowed = "." if session.thinking_switchable else \
                ", where the model's chat template allows it (this one does not)."
            raise CommandError(f"Thinking is {state} in this conversation; /thinking on or off switches it{allowed}")
        enabled = slash_commands.thinking_switch(argument)
        if self.generating:
            raise CommandError("Stop the reply first (Esc), then switch thinking.")
        try:
            session.set_thinking(enabled)
        except ChatError as exc:
            raise CommandError(str(exc)) from None
        except StorageError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return False
        # A regenerated reply answers its message as it was sent (its prompt's tokens are reused as they are).
        self.notify(f"Thinking {'on' if enabled else 'off'} in this conversation from your next message on.",
                    timeout=4)
        return True
