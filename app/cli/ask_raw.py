"""`kvchat ask --raw TEXT`: the text as is, continued by the model: no chat template, no chat format, and
no special tokens but those the tokenizer adds by default (most base models' BOS). A completion, not a
chat turn, so nothing is saved; it streams and stops as `kvchat ask` does (app/cli/ask.py)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

# What a raw completion cannot take: it has no conversation to continue or keep settings with, and a remote
# server is asked in chat messages (its own template), not in the text as is.
CONVERSATION_FLAGS = (("conversation", "--conversation"), ("continue_last", "--continue"), ("system", "--system"),
                      ("save_settings", "--save-settings"), ("remote", "--remote"))


def check_raw_flags(args: argparse.Namespace) -> None:
    """ValueError with one phrase for a flag --raw cannot take."""
    given = [flag for name, flag in CONVERSATION_FLAGS if getattr(args, name, None) not in (None, False)]
    if given:
        raise ValueError(f"--raw sends the text as is to the embedded model, outside any conversation; "
                         f"it cannot take {given[0]}")


class RawCompletion:
    """The one request of `ask --raw`, shaped as ask's _answer drives a ChatSession (send, cancel)."""

    def __init__(self, engine, params):
        self.engine, self.params, self.generation = engine, params, None

    def send(self, text: str) -> Iterator:
        from app.chat.prompt.template import raw_prompt_ids

        self.generation = self.engine.generate(raw_prompt_ids(self.engine.tokenizer, text), self.params)
        return iter(self.generation)

    def cancel(self) -> None:
        if self.generation is not None:
            self.generation.cancel()
