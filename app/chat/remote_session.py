"""RemoteChatSession: a conversation answered by a remote OpenAI-compatible server (app/remote/client.py).

The same messages, branches, settings and storage as ChatSession, but each reply
is asked for with the conversation's messages as text: the server renders its
chat template and reuses its own prefix cache. There are no token ids to keep
and no K/V to store; the history is saved as text (and, opened later with the
embedded engine, tokenized afresh).
"""

from __future__ import annotations

from collections.abc import Iterator

from app.chat.chat_message import ChatMessage
from app.chat.reply.alternatives import Drive, Stream, one_after_another
from app.chat.session import ChatSession
from engine import Event, SamplingParams


class RemoteChatSession(ChatSession):
    def _turn(self, before: list[ChatMessage], seen: list[int], user_text: str) -> Iterator[Event]:
        self._check_length(user_text)
        with self._taking_turn():
            generation = self.engine.chat(self.prompt.turns([*before, ChatMessage("user", user_text)]), self.reply_params)
            self.rewritten_at = None
            self._record_user(before, user_text, 0, 0, [])
        self.generation = generation
        return self._stream(generation, [])

    def regenerate(self) -> Iterator[Event]:
        before = self._regenerating()
        with self._taking_turn():
            self._restart(before, self.engine.chat(self.prompt.turns(before), self.reply_params))
        return self._stream(self.generation, [])

    def _alternative_streams(self, before: list[ChatMessage], params: list[SamplingParams]
                             ) -> tuple[list[int], list[Stream], Drive]:
        # A server writes one reply per request; they are asked for one after another (see reply/alternatives.py).
        turns = self.prompt.turns(before)
        return [], [self.engine.chat(turns, p) for p in params], one_after_another
