"""CallWatch: with tools offered, a reply's calls watched as it streams (SessionTools.call_reader), so a call
written twice ends the reply there (ChatSession's stream of a reply feeds it each event)."""

from __future__ import annotations

import dataclasses

from engine import Done, Generation, TokenDelta


class CallWatch:
    def __init__(self, reader, generation: Generation):
        """`reader`: the reply's call reader (None: no tools offered, or a server: nothing is watched);
        `generation`: the reply's, cancelled when a call repeats."""
        self.reader = reader
        self.generation = generation
        self.repeated = False

    def token(self, event: TokenDelta) -> None:
        if self.reader is not None and event.token_id is not None and not self.repeated:
            self.reader.feed_token(event.token_id)
            if self.reader.repeats_a_call:
                self.repeated = True
                self.generation.cancel()  # Done("stopped") before the next step

    def done(self, event: Done) -> Done:
        """The reply's Done: a reply stopped on a repeated call ended as the model's own stop would."""
        if self.repeated and event.finish_reason == "stopped":
            event = dataclasses.replace(event, finish_reason="stop")  # ended by us, on a call
        return event
