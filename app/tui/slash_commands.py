"""Slash commands typed in the message box: `/system TEXT`, `/temperature X`, `/model NAME`,
`/thinking on|off`, `/tools`, `/clear`, `/file PATH`, `/drop-oldest MESSAGE`, `/compact MESSAGE`, `/help`.

A command is a slash and a word at the start of the box, then a space, a new line or the end:
`/temperature 0.3`. Anything else is a message, sent as typed: `/etc/hosts is empty`, `/ 2`,
`3/4`. A message that must start with a command's shape is sent by doubling its slash: `//help me`
sends "/help me". parse() only reads the text; the chat pane carries the command out (chat/commands.py).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from app.chat.local_models import LocalModel, model_from_spec
from engine import SamplingParams

# name -> (what it takes, what it does), in the order /help and the F1 help list them.
COMMANDS = {
    "system": ("TEXT", "Set this conversation's system prompt"),
    "temperature": ("X", "Set the sampling temperature (0 = greedy)"),
    "model": ("NAME", "Switch to another model (alone: list them)"),
    "thinking": ("on|off", "Let a reasoning model think in this conversation, or not (its template must allow it)"),
    "tools": ("", "Choose the tools (MCP servers') this conversation offers the model"),
    "clear": ("", "Start a new chat"),
    "file": ("PATH", "Put a text file's content in the message being written"),
    "drop-oldest": ("MESSAGE", "Send MESSAGE on a new branch without the oldest turns (when the context is full)"),
    "compact": ("MESSAGE", "Send MESSAGE on a new branch that starts from the model's summary of this one"),
    "help": ("", "Show every key and command"),
}
ESCAPE = "//"  # a message starting with "/" that would read as a command

_COMMAND = re.compile(r"/([A-Za-z][A-Za-z0-9_-]*)(?:\s+(.*))?\Z", re.DOTALL)


class CommandError(ValueError):
    """A command that cannot be carried out as typed; the message is one sentence for the user."""


@dataclass(frozen=True)
class Command:
    name: str  # a key of COMMANDS
    argument: str  # what follows the name, stripped; "" when nothing does


@dataclass(frozen=True)
class UnknownCommand:
    name: str

    def sentence(self) -> str:
        known = ", ".join(f"/{name}" for name in COMMANDS)
        return (f"/{self.name} is not a command. The commands are {known}; start a message with "
                f"{ESCAPE} to send it with a single / at the start.")


def parse(text: str) -> Command | UnknownCommand | str:
    """What the box's `text` (stripped) asks for: a Command, an UnknownCommand, or the message to send
    (the text itself, with a doubled leading slash made single)."""
    if text.startswith(ESCAPE):
        return text[1:]
    match = _COMMAND.match(text)
    if match is None:
        return text
    name, argument = match.group(1).lower(), (match.group(2) or "").strip()
    return Command(name, argument) if name in COMMANDS else UnknownCommand(name)


def usage(name: str) -> str:
    """`/name ARGUMENT`, as the help shows it."""
    takes = COMMANDS[name][0]
    return f"/{name} {takes}".rstrip()


def temperature(argument: str, params: SamplingParams) -> SamplingParams:
    """`params` with the temperature `/temperature ARGUMENT` asks for; CommandError says why not."""
    try:
        value = float(argument)
    except ValueError:
        raise CommandError("The temperature must be a number, such as /temperature 0.7 (0 = greedy).") from None
    try:
        return dataclasses.replace(params, temperature=value)
    except ValueError as exc:  # out of SamplingParams' bounds, or not finite
        reason = str(exc)
        raise CommandError(reason[:1].upper() + reason[1:] + f"; {argument} is not.") from None


def thinking_switch(argument: str) -> bool:
    """The switch `/thinking ARGUMENT` asks for (on: True); CommandError says why not."""
    words = {"on": True, "off": False}
    if argument.lower() not in words:
        raise CommandError(f"/thinking takes on or off, not “{argument}”.")
    return words[argument.lower()]


def choose_model(name: str, models: list[LocalModel]) -> LocalModel:
    """The model of `models` that `/model NAME` means: the one with that name or spec (ignoring
    case), else the only one whose name contains it, else NAME as a path to a model directory or
    .gguf file that exists. CommandError lists the choices otherwise."""
    wanted = name.casefold()
    exact = [m for m in models if wanted in (m.name.casefold(), (m.spec or "").casefold())]
    partial = [m for m in models if wanted in m.name.casefold()]
    for found in (exact, partial):
        if len(found) == 1:
            return found[0]
    if not partial and Path(name).expanduser().exists():
        return model_from_spec(name, "given by its path")
    choices = ", ".join(m.name for m in (partial if len(partial) > 1 else models)) or "none found"
    what = f"“{name}” matches several models" if len(partial) > 1 else f"There is no model “{name}”"
    raise CommandError(f"{what}; choose one of: {choices}.")
