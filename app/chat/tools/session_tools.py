"""SessionTools: a ChatSession's tool calls. The tools it offers the model, the calls each reply makes (read
as the reply streams, and from its finished token ids), and their results: sent back as tool messages for the
model's next reply (a round of the tool loop: app/chat/tool_loop.py), or kept without one.

It is a part of the session (ChatSession.tools), not a session of its own: it reads and sets the session's
messages and starts a round's reply through the session's own turn (its prompt, its generation, its stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from app.chat.chat_message import ChatMessage
from app.chat.errors import ChatError
from app.tools.messages import calls_of, reply_tools, result_tools
from app.tools.spec import ToolCall, ToolResult, ToolSpec, once_each
from app.tools.toolbox import ToolChoice
from engine import Done, Event, Generation, SamplingParams

if TYPE_CHECKING:
    from app.chat.backend import Backend
    from app.chat.prompt.conversation_prompt import ConversationPrompt, TurnPrompt
    from app.chat.saved.conversation import SavedConversation


class ToolSession(Protocol):
    """What SessionTools uses of the session that owns it (ChatSession): its messages, prompt and turn."""

    messages: list[ChatMessage]
    prompt: ConversationPrompt
    engine: Backend
    saved: SavedConversation | None
    seen_ids: list[int]
    token_ids: bool  # an embedded model: the calls are read from the reply's token ids
    opens_thinking: bool

    @property
    def reply_params(self) -> SamplingParams: ...

    def taking_turn(self) -> AbstractContextManager[None]: ...

    def generate_turn(self, prompt: TurnPrompt, seen: list[int], record: Callable[[int, int, list[int]], None]
                      ) -> Generation: ...

    def begin_reply(self, generation: Generation, prompt: TurnPrompt) -> Iterator[Event]: ...


class SessionTools:
    def __init__(self, session: ToolSession):
        self.session = session

    def use_tools(self, tools: list[ToolSpec], choice: ToolChoice = ToolChoice()) -> None:
        """Offer `tools` to the model from the next reply on ([]: none), to be used as `choice` says. The
        prompt renders them through the model's template (or kvchat's convention) and the replies follow
        the format's grammar once a call begins (app/tools/formats/)."""
        self.session.prompt.tools, self.session.prompt.tool_choice = list(tools), choice

    @property
    def last_calls(self) -> list[ToolCall]:
        """The tool calls the last reply made ([] when it made none, or is not the last message)."""
        messages = self.session.messages
        last = messages[-1] if messages else None
        return calls_of(last.tools) if last is not None and last.role == "assistant" else []

    def call_reader(self):
        """A reader of the reply about to stream (a ToolCallParser: feed_token(id) gives the text to show, the
        call markup left out; flush() at its end) when tools are offered to an embedded model; None otherwise
        (no tools, or a server, which streams no markup)."""
        session = self.session
        if not (session.prompt.tools and session.token_ids):
            return None
        return session.prompt.tool_format.stream_parser(session.prompt.tools, session.opens_thinking)

    def send_results(self, results: list[ToolResult], servers: dict[str, str | None] | None = None
                     ) -> Iterator[Event]:
        """The results of the last reply's calls, as tool messages, and the model's next reply to them (a
        round of the tool loop: app/chat/tool_loop.py). The prompt extends what the model has seen, so the
        round prefills the results alone. `servers`: which server ran each tool, kept with its message."""
        session = self.session
        before, seen, tool_messages = session.messages, session.seen_ids, self._tool_messages(results, servers)
        with session.taking_turn():
            prompt = session.prompt.after(seen, [*before, *tool_messages])
            room = session.engine.context_window
            if room and len(prompt.ids) + (session.reply_params.max_tokens or 1) > room:
                raise ChatError(f"The tool results make the conversation {len(prompt.ids):,} tokens, which leaves "
                                f"no room for a reply in the model's {room:,}-token window.")
            generation = session.generate_turn(prompt, seen, lambda end, start, new: self._record_tools(
                before, tool_messages, end, start, new))
        return session.begin_reply(generation, prompt)

    def keep_results(self, results: list[ToolResult]) -> None:
        """Keep the results of the last reply's calls as tool messages without asking for a reply (the loop was
        stopped): the next message follows them, so the template never sees a call left unanswered."""
        if not self.last_calls:
            return
        session = self.session
        with session.taking_turn():
            self._record_tools(session.messages, self._tool_messages(results), 0, len(session.seen_ids), [])
        if session.saved is not None:
            session.saved.end_turn()

    def _tool_messages(self, results: list[ToolResult], servers: dict[str, str | None] | None = None
                       ) -> list[ChatMessage]:
        """The tool messages of the last reply's call results (`servers`: which ran each tool); ChatError when
        the last reply made no call."""
        if not self.last_calls:
            raise ChatError("The last reply made no tool call to answer.")
        servers = servers or {}
        return [ChatMessage("tool", r.text, tools=result_tools(r, servers.get(r.call.name))) for r in results]

    def _record_tools(self, before: list[ChatMessage], tool_messages: list[ChatMessage], token_end: int,
                      token_start: int, new_ids: list[int]) -> None:
        """Commit the round's tool messages after `before`; the last carries the round's new prompt ids."""
        saved = self.session.saved
        parent = before[-1].id if before else None
        for i, message in enumerate(tool_messages):
            last = i == len(tool_messages) - 1
            message.token_end = token_end if last else 0
            if saved is not None:
                parent = message.id = saved.tool_message(parent, message.content, message.tools,
                                                         token_start, new_ids if last else [])
        self.session.messages = [*before, *tool_messages]

    def with_calls(self, message: ChatMessage, done: Done) -> ChatMessage:
        """`message` (a finished reply) as kept when tools are offered: its text without the call markup, and
        the calls it made (app/tools/formats/ reads the format's markup from the reply's token ids), each once.
        A call the model wrote but the format cannot read is left in the text, with the reason in the reply's
        stats."""
        session = self.session
        if not (session.prompt.tools and session.token_ids) or done.finish_reason not in ("stop", "length"):
            return message
        parsed = session.prompt.parse_reply(list(done.token_ids), session.opens_thinking)
        if parsed.error:  # the calls that did read still run (a reply cut by its length ends inside one)
            message.stats = {**(message.stats or {}), "tool_call_error": parsed.error}
        if parsed.calls:
            message.content, message.tools = parsed.content, reply_tools(once_each(parsed.calls))
        return message
