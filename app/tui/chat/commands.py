"""Slash commands typed in the message box (slash_commands.py parses them): each carried out, or refused in
one sentence with the command given back to the box. SlashCommands is the chat pane's (pane.py), which
hands it what Enter sent when it is a command; /drop-oldest and /compact are the pane's WaysOn's
(overflow.py), the settings' commands go through the app's ConversationSettings (settings.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from app.chat.backend_loader import is_remote
from app.chat.errors import ChatError
from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.tui import slash_commands
from app.tui.file_attachment import NO_WINDOW_MAX_CHARS, AttachmentError, read_attachment
from app.tui.slash_commands import Command, CommandError, UnknownCommand
from app.tui.token_meter import count_tokens, room_left
from app.tui.widgets.prompt_input import PromptInput
from storage.errors import StorageError

if TYPE_CHECKING:
    from app.chat.backend import Backend
    from app.chat.session import ChatSession
    from app.tui.chat.overflow import WaysOn
    from app.tui.chat.settings import ConversationSettings
    from app.tui.chat.tool_use import ToolUse


@runtime_checkable  # so a test can check that the chat pane keeps it
class CommandsPane(Protocol):
    """What SlashCommands uses of the chat pane that owns it (ChatPane), besides Textual's Widget."""

    host: CommandsHost  # the app
    ways_on: WaysOn
    tool_use: ToolUse

    @property
    def generating(self) -> bool: ...

    def give_back(self, typed: str, sentence: str = "", severity: str = "warning") -> None: ...

    def context_used(self) -> int: ...


class CommandsHost(Protocol):
    """What SlashCommands uses of the app, through the pane (see pane.ChatHost)."""

    session: ChatSession | None
    engine: Backend | None
    settings: ConversationSettings

    async def action_new_chat(self) -> None: ...

    def action_help(self) -> None: ...


class SlashCommands:
    """Carries out the commands typed in the box (the chat pane's)."""

    def __init__(self, pane: CommandsPane):
        self.pane = pane

    async def run(self, command: Command | UnknownCommand, typed: str) -> None:
        """Carry out a command typed in the box (which Enter emptied). Done: it is in the Up history;
        refused: one sentence says why and it comes back to the box, to be corrected."""
        if isinstance(command, UnknownCommand):
            self.pane.give_back(typed, command.sentence())
            return
        try:
            if command.name == "file":
                self._attach_file(command.argument, typed)
                return  # the box gets the file's content once it is read and counted
            done = await self._command(command.name)(command.argument)
        except CommandError as exc:
            self.pane.give_back(typed, str(exc))
            return
        if done:
            self.pane.query_one(PromptInput).remember(typed)
        else:  # refused, and said why
            self.pane.give_back(typed)

    def _command(self, name: str):
        """The method that carries out command `name` (slash_commands.COMMANDS names them all)."""
        if name == "drop-oldest":
            return self.pane.ways_on.command_drop_oldest
        if name == "compact":
            return self.pane.ways_on.command_compact
        return getattr(self, f"_command_{name}")

    # Each returns True once done, False if it was refused (and said why); CommandError for a bad argument.

    async def _command_system(self, text: str) -> bool:
        if not text:
            raise CommandError("/system needs the text of the system prompt, such as /system Answer briefly. "
                               "(Ctrl+O can clear it, for the model's default.)")
        settings = self.pane.host.settings
        old = settings.current()
        return await settings.apply(old, dataclasses.replace(old, system=text))

    async def _command_temperature(self, argument: str) -> bool:
        settings = self.pane.host.settings
        old = settings.current()
        if not argument:
            raise CommandError(f"The temperature is {old.params.temperature:g}; /temperature X changes it "
                               "(0 = greedy).")
        new = dataclasses.replace(old, params=slash_commands.temperature(argument, old.params))
        if not await settings.apply(old, new):
            return False
        self.pane.notify(f"Temperature {new.params.temperature:g} from the next reply on.", timeout=4)
        return True

    async def _command_model(self, name: str) -> bool:
        settings = self.pane.host.settings
        models = settings.model_choices()
        if not name:
            names = ", ".join(model.name for model in models) or "none found"
            raise CommandError(f"/model NAME switches the model; these are here: {names}.")
        chosen = slash_commands.choose_model(name, models)
        old = settings.current()
        return await settings.apply(old, dataclasses.replace(old, model=chosen.spec))

    async def _command_thinking(self, argument: str) -> bool:
        """`/thinking on|off`: a conversation's thinking switch (ChatSession.set_thinking), for a reasoning
        model whose chat template reads `enable_thinking`. A bare /thinking says how it is."""
        session = self.pane.host.session
        if session is None:
            raise CommandError("Thinking can be switched once the model and the conversation are ready.")
        if not argument:
            state = "on" if session.thinking else "off"
            allowed = "." if session.thinking_switchable else \
                ", where the model's chat template allows it (this one does not)."
            raise CommandError(f"Thinking is {state} in this conversation; /thinking on or off switches it{allowed}")
        enabled = slash_commands.thinking_switch(argument)
        if self.pane.generating:
            raise CommandError("Stop the reply first (Esc), then switch thinking.")
        try:
            session.set_thinking(enabled)
        except ChatError as exc:
            raise CommandError(str(exc)) from None
        except StorageError as exc:
            self.pane.notify(str(exc), severity="error", timeout=10)
            return False
        # A regenerated reply answers its message as it was sent (its prompt's tokens are reused as they are).
        self.pane.notify(f"Thinking {'on' if enabled else 'off'} in this conversation from your next message on.",
                         timeout=4)
        return True

    async def _command_tools(self, argument: str) -> bool:
        """`/tools`: the tools and their switches for this conversation (chat/tool_use.py)."""
        return self.pane.tool_use.choose()

    async def _command_clear(self, argument: str) -> bool:
        if self.pane.generating:
            raise CommandError("Stop the reply first (Esc), then /clear starts a new chat.")
        await self.pane.host.action_new_chat()
        return True

    async def _command_help(self, argument: str) -> bool:
        self.pane.host.action_help()
        return True

    def _attach_file(self, argument: str, typed: str) -> None:
        path, _, rest = argument.partition("\n")
        if not path.strip():
            raise CommandError("/file needs the path of a text file, such as /file notes.txt.")
        if self.pane.host.session is None:
            raise CommandError("A file can be attached once the model and the conversation are ready.")
        self.pane.run_worker(self._attach(path.strip(), rest, typed), exclusive=True, group="attach-file")

    async def _attach(self, path: str, rest: str, typed: str) -> None:
        """Read and count the file off the UI thread; if it fits the context window's room, it takes the
        command's place in the box, with the lines typed after the command, and its size is shown."""
        pane, engine = self.pane, self.pane.host.engine
        window = engine.context_window if engine else 0
        try:
            attachment = await asyncio.to_thread(read_attachment, path,
                                                 MAX_CHARS_PER_TOKEN * window if window else NO_WINDOW_MAX_CHARS)
        except AttachmentError as exc:
            pane.give_back(typed, str(exc))
            return
        block = attachment.as_message_text()
        tokenizer = None if is_remote(engine) or engine is None else engine.tokenizer
        count, used = await asyncio.to_thread(lambda: (count_tokens(block, tokenizer), pane.context_used()))
        size = f"{'≈ ' if count.estimated else ''}{count.tokens:,} tokens"
        if window and room_left(count, window, used) < 1:
            pane.give_back(typed, f"{attachment.name} is {size}, more than the {max(0, window - used - 1):,} this "
                           f"conversation's context window ({window:,} tokens) has room for; /clear starts a new "
                           "chat.")
            return
        prompt = pane.query_one(PromptInput)
        prompt.remember(typed)
        if prompt.text.strip():  # typed meanwhile: the file goes before it, nothing of it is replaced
            prompt.replace(block + rest + "\n", (0, 0), (0, 0), maintain_selection_offset=True)
        else:
            prompt.replace_all(block + rest)
        pane.notify(f"Attached {attachment.name} ({size}); write your message and press Enter.", timeout=6)
