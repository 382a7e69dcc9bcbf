"""Slash commands typed in the message box (slash_commands.py parses them): each carried out, or refused in
one sentence with the command given back to the box. A mixin of KvchatApp beside ReplyActions (reply.py),
whose _give_back it uses; /drop-oldest and /compact are ContextActions' (context.py)."""

from __future__ import annotations

import asyncio
import dataclasses

from app.chat.backend_loader import is_remote
from app.chat.message_length import MAX_CHARS_PER_TOKEN
from app.tui import slash_commands
from app.tui.file_attachment import NO_WINDOW_MAX_CHARS, AttachmentError, read_attachment
from app.tui.slash_commands import Command, CommandError, UnknownCommand
from app.tui.token_meter import count_tokens, room_left
from app.tui.widgets.prompt_input import PromptInput


class CommandActions:
    """A mixin of KvchatApp (what it uses of it: ReplyHost in reply.py, ReplyActions._give_back, and
    Textual's App)."""

    # ---- slash commands (app/tui/slash_commands.py parses them)

    async def _run_command(self, command: Command | UnknownCommand, typed: str) -> None:
        """Carry out a command typed in the box (which Enter emptied). Done: it is in the Up history;
        refused: one sentence says why and it comes back to the box, to be corrected."""
        if isinstance(command, UnknownCommand):
            self._give_back(typed, command.sentence())
            return
        try:
            if command.name == "file":
                self._attach_file(command.argument, typed)
                return  # the box gets the file's content once it is read and counted
            done = await getattr(self, f"_command_{command.name.replace('-', '_')}")(command.argument)
        except CommandError as exc:
            self._give_back(typed, str(exc))
            return
        if done:
            self.query_one(PromptInput).remember(typed)
        else:  # refused, and said why
            self._give_back(typed)

    # Each returns True once done, False if it was refused (and said why); CommandError for a bad argument.

    async def _command_system(self, text: str) -> bool:
        if not text:
            raise CommandError("/system needs the text of the system prompt, such as /system Answer briefly. "
                               "(Ctrl+O can clear it, for the model's default.)")
        old = self.current_settings()
        return await self._apply_settings(old, dataclasses.replace(old, system=text))

    async def _command_temperature(self, argument: str) -> bool:
        old = self.current_settings()
        if not argument:
            raise CommandError(f"The temperature is {old.params.temperature:g}; /temperature X changes it "
                               "(0 = greedy).")
        new = dataclasses.replace(old, params=slash_commands.temperature(argument, old.params))
        if not await self._apply_settings(old, new):
            return False
        self.notify(f"Temperature {new.params.temperature:g} from the next reply on.", timeout=4)
        return True

    async def _command_model(self, name: str) -> bool:
        models = self.model_choices()
        if not name:
            names = ", ".join(model.name for model in models) or "none found"
            raise CommandError(f"/model NAME switches the model; these are here: {names}.")
        chosen = slash_commands.choose_model(name, models)
        old = self.current_settings()
        return await self._apply_settings(old, dataclasses.replace(old, model=chosen.spec))

    async def _command_clear(self, argument: str) -> bool:
        if self.generating:
            raise CommandError("Stop the reply first (Esc), then /clear starts a new chat.")
        await self.action_new_chat()
        return True

    async def _command_help(self, argument: str) -> bool:
        self.action_help()
        return True

    def _attach_file(self, argument: str, typed: str) -> None:
        path, _, rest = argument.partition("\n")
        if not path.strip():
            raise CommandError("/file needs the path of a text file, such as /file notes.txt.")
        if self.session is None:
            raise CommandError("A file can be attached once the model and the conversation are ready.")
        self.run_worker(self._attach(path.strip(), rest, typed), exclusive=True, group="attach-file")

    async def _attach(self, path: str, rest: str, typed: str) -> None:
        """Read and count the file off the UI thread; if it fits the context window's room, it takes the
        command's place in the box, with the lines typed after the command, and its size is shown."""
        engine = self.engine
        window = engine.context_window if engine else 0
        try:
            attachment = await asyncio.to_thread(read_attachment, path,
                                                 MAX_CHARS_PER_TOKEN * window if window else NO_WINDOW_MAX_CHARS)
        except AttachmentError as exc:
            self._give_back(typed, str(exc))
            return
        block = attachment.as_message_text()
        tokenizer = None if is_remote(engine) or engine is None else engine.tokenizer
        count, used = await asyncio.to_thread(lambda: (count_tokens(block, tokenizer), self.context_used()))
        size = f"{'≈ ' if count.estimated else ''}{count.tokens:,} tokens"
        if window and room_left(count, window, used) < 1:
            self._give_back(typed, f"{attachment.name} is {size}, more than the {max(0, window - used - 1):,} this "
                            f"conversation's context window ({window:,} tokens) has room for; /clear starts a new "
                            "chat.")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(typed)
        if prompt.text.strip():  # typed meanwhile: the file goes before it, nothing of it is replaced
            prompt.replace(block + rest + "\n", (0, 0), (0, 0), maintain_selection_offset=True)
        else:
            prompt.replace_all(block + rest)
        self.notify(f"Attached {attachment.name} ({size}); write your message and press Enter.", timeout=6)
