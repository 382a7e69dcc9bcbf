"""RemoteChatSession: a conversation answered by a remote OpenAI-compatible server (app/remote/client.py).

The same messages, branches, settings and storage as ChatSession, but each reply
is asked for with the conversation's messages as text: the server renders its
chat template and reuses its own prefix cache. There are no token ids to keep
and no K/V to store; the history is saved as text (and, opened later with the
embedded engine, tokenized afresh).

Tools and response_format go to the server as OpenAI's fields: it renders the tools in its template,
constrains the reply and parses the calls (vLLM's, SGLang's and llama.cpp's tool parsers), and the stream
hands the calls over (RemoteGeneration.tool_calls), so the tool loop (app/chat/tool_loop.py) runs the same:
RemoteSessionTools reads and answers them.
"""

from __future__ import annotations

from collections.abc import Iterator

from app.chat.chat_message import ChatMessage
from app.chat.reply.alternatives import Drive, Stream, one_after_another
from app.chat.session import ChatSession
from app.chat.tools.session_tools import SessionTools
from app.tools.messages import reply_tools
from app.tools.spec import ToolResult
from engine import Done, Event, SamplingParams


class RemoteSessionTools(SessionTools):
    """A remote conversation's tool calls: a round's results go to the server as messages, and the calls are
    the ones the server parsed."""

    session: RemoteChatSession

    def send_results(self, results: list[ToolResult], servers: dict[str, str | None] | None = None
                     ) -> Iterator[Event]:
        session = self.session
        before, tool_messages = session.messages, self._tool_messages(results, servers)
        with session.taking_turn():
            generation = session.ask([*before, *tool_messages])
            self._record_tools(before, tool_messages, 0, 0, [])
        session.generation = generation
        return session.stream_reply(generation, [])

    def with_calls(self, message: ChatMessage, done: Done) -> ChatMessage:
        """The calls the server parsed from the reply (its text holds none of their markup)."""
        generation = self.session.generation
        calls = getattr(generation, "tool_calls", [])
        error = getattr(generation, "tool_call_error", None)
        if error:
            message.stats = {**(message.stats or {}), "tool_call_error": error}
        if calls and done.finish_reason == "stop":
            message.tools = reply_tools(calls)
        return message


class RemoteChatSession(ChatSession):
    tools_class = RemoteSessionTools

    def ask(self, messages: list[ChatMessage], params: SamplingParams | None = None):
        """The server's reply to `messages`, with the conversation's tools and response_format."""
        prompt = self.prompt
        return self.engine.chat(prompt.turns(messages), params or self.reply_params, prompt.tools,
                                prompt.tool_choice, prompt.response_format)

    def _turn(self, before: list[ChatMessage], seen: list[int], user_text: str) -> Iterator[Event]:
        self._check_length(user_text)
        with self.taking_turn():
            generation = self.ask([*before, ChatMessage("user", user_text)])
            self.rewritten_at = None
            self._record_user(before, user_text, 0, 0, [])
        self.generation = generation
        return self.stream_reply(generation, [])

    def regenerate(self) -> Iterator[Event]:
        before = self._regenerating()
        with self.taking_turn():
            self._restart(before, self.ask(before))
        return self.stream_reply(self.generation, [])

    def _alternative_streams(self, before: list[ChatMessage], params: list[SamplingParams]
                             ) -> tuple[list[int], list[Stream], Drive]:
        # A server writes one reply per request; they are asked for one after another (see reply/alternatives.py).
        return [], [self.ask(before, p) for p in params], one_after_another
