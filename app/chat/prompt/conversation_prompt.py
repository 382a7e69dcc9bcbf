"""The one way into prompt/: a conversation's messages -> the token ids of the prompt the engine gets.

A ChatSession asks here once per turn (ConversationPrompt.turn). On the way:
1. the system prompt and the messages become the chat API's turns, a compacted branch's summary joined
   to the system prompt (summary_turns.py);
2. the turns become text: the model's chat template, or the standard format chosen for a model without
   one (template.py, format_choice.py), with thinking switched off where the template reads the switch
   (thinking.py);
3. the text becomes ids that extend, token for token, the ids the model has seen (ids.py);
4. a prompt that leaves the reply too little of the context window is refused (context_room.py).
A remote server is sent the turns of step 1 and does the rest itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from app.chat.backend import Backend, takes_token_ids
from app.chat.chat_message import ChatMessage
from app.chat.prompt.context_room import require_room
from app.chat.prompt.format_choice import FormatChoice, conversation_format, format_params
from app.chat.prompt.ids import next_prompt
from app.chat.prompt.summary_turns import with_summaries
from app.chat.prompt.template import render_chat
from app.chat.prompt.thinking import split_reply, prompt_opens_thinking, template_switches_thinking
from app.tools.messages import template_turn
from app.tools.toolbox import ToolChoice
from app.tools.spec import ToolSpec
from engine.sampling_params import SamplingParams

# The prompt's last tokens that tell whether it ends inside an open <think> (R1-distill templates):
# far more than a generation prompt's few, far fewer than a long history's.
PROMPT_TAIL_TOKENS = 32


@dataclass(frozen=True)
class TurnPrompt:
    """A turn's prompt, ready for the engine."""

    ids: list[int]
    rewritten_at: int | None  # None: it extends the ids the model has seen; else the first position that differs
    opens_thinking: bool  # it ends inside an open <think>: the reply begins in its reasoning

    def unseen_from(self, seen: int) -> int:
        """Where the ids the model has not seen begin, when it has seen the first `seen` of the history's."""
        return seen if self.rewritten_at is None else self.rewritten_at


def response_grammar(response_format: dict) -> str | None:
    """The grammar of OpenAI's `response_format`: {"type": "text"} none, "json_object" any JSON object,
    "json_schema" a value following its `json_schema.schema`. ValueError (one phrase) for another shape."""
    from engine.request.grammars import json_grammar

    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar(None)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ValueError("response_format json_schema needs a json_schema object with a schema")
        return json_grammar(spec.get("schema") or {})
    raise ValueError(f"response_format type must be text, json_object or json_schema, not {kind!r}")


class ConversationPrompt:
    """What one conversation's prompts are written with: its chat format (chosen once, when the conversation
    is opened), its system prompt and its thinking switch (the session changes those two and keeps them)."""

    def __init__(self, backend: Backend, kept_format: str | None, system: str | None, thinking: bool):
        """`kept_format`: the standard format the conversation was written in (None: a new conversation, or
        one written in its model's template). `system=None` renders the user's messages only, so the model's
        own default system prompt (if its template has one) applies."""
        self.backend = backend
        self.system = system
        # Off renders the template with enable_thinking=False, where the template reads it (thinking_switchable).
        self.thinking = thinking
        self.takes_ids = takes_token_ids(backend)
        # A server renders its own template. A model without one gets a standard format (the one the
        # conversation was written in, when it has one); `format_notice` says which, for the user.
        choice = conversation_format(backend, kept_format) if self.takes_ids else FormatChoice(None, None)
        self.chat_format, self.format_notice = choice.chat_format, choice.notice
        # The tools the model is offered (ChatSession.use_tools) and how it must use them in the next reply.
        self.tools: list[ToolSpec] = []
        self.tool_choice = ToolChoice()
        # OpenAI's response_format for the next replies (`kvchat ask --json-schema`): None, {"type":
        # "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}.
        self.response_format: dict | None = None
        # False: tools are offered but the reply is not held to their grammar (`kvchat bench --tools`
        # measures how often a model alone writes a valid call); kvchat itself always constrains.
        self.constrained = True
        # Whether the last prompt built ends inside an open <think>: its reply's grammar and parser start there.
        self.opens_thinking_next = False

    @cached_property
    def tool_format(self):
        """How this model writes tool calls and reads tools (app/tools/formats/): its template's own format,
        or kvchat's JSON convention in the system prompt for a template without one."""
        from app.tools.formats.detect import tool_format

        return tool_format(self.backend.tokenizer, self.chat_format)

    @property
    def thinking_switchable(self) -> bool:
        """Whether the model's chat template can turn thinking off (it reads `enable_thinking`)."""
        # A standard format (a model without a template, formats.py) has no switch.
        return (self.takes_ids and self.chat_format is None
                and template_switches_thinking(self.backend.tokenizer.chat_template))

    def template_options(self) -> dict:
        """The variables the chat template is rendered with: enable_thinking=False when thinking is switched
        off and the template takes it; else none."""
        return {"enable_thinking": False} if not self.thinking and self.thinking_switchable else {}

    def reply_params(self, params: SamplingParams) -> SamplingParams:
        """`params` with what ends a reply in a standard format: its end-of-turn marker (or a transcript's
        next "User:")."""
        if self.chat_format is not None:
            params = format_params(self.backend.tokenizer, self.chat_format, params)
        grammar = self.tool_grammar()
        return params if grammar is None else dataclasses.replace(params, grammar=grammar)

    def tool_grammar(self) -> str | None:
        """The grammar the next reply follows: one JSON value when a response_format asks for it; else, when
        tools are offered, free text and a call once one begins, in the format's markup and the tools'
        schemas (from the first token for "required" or a named tool); None for neither, or for a remote
        server (it constrains its own replies: app/remote/client.py sends both fields)."""
        if not self.takes_ids or not self.constrained:
            return None
        if self.response_format is not None:
            return response_grammar(self.response_format)
        if not self.tools or self.tool_choice.mode == "none":
            return None
        return self.tool_format.grammar(self.tools, self.tool_choice.mode, self.tool_choice.parallel,
                                        self.opens_thinking_next)

    def turns(self, messages: list[ChatMessage]) -> list[dict]:
        """The system prompt (if any) and `messages` as the chat API's {"role", "content"} dicts."""
        turns = [{"role": "system", "content": self.system}] if self.system is not None else []
        return with_summaries(turns + [template_turn(m.role, self._content(m), m.tools) for m in messages])

    def _content(self, message: ChatMessage) -> str:
        """What the template is given of a message. A harmony model's (gpt-oss) reply is kept as kvchat writes
        it, reasoning in <think> (engine/tokenizer/harmony.py); its template takes the answer alone as a past
        reply's content (it drops earlier reasoning itself), so the block is cut here."""
        if message.role == "assistant" and self.takes_ids and getattr(self.backend.tokenizer, "harmony", False):
            return split_reply(message.content).answer
        return message.content

    def text(self, messages: list[ChatMessage]) -> str:
        """The prompt's text of `messages`, ready for the assistant's reply."""
        turns = self.turns(messages)
        if self.takes_ids and (self.tools or any(m.tools for m in messages)):
            offered = self.tools if self.tool_choice.mode != "none" else []
            return self.tool_format.render(turns, offered, self.chat_format, self.tool_choice.parallel,
                                           **self.template_options())
        return render_chat(self.backend.tokenizer, turns, self.chat_format, **self.template_options())

    def tokens(self, messages: list[ChatMessage]) -> int:
        """How many tokens the prompt of `messages` is, tokenized afresh."""
        return len(self.backend.tokenizer.encode(self.text(messages)))

    def after(self, seen: list[int], messages: list[ChatMessage]) -> TurnPrompt:
        """The prompt of `messages` (the last the user's), extending the `seen` ids (the previous prompt and
        reply, as the model saw them) wherever the template allows."""
        prompt = next_prompt(self.backend.tokenizer, seen, self.text(messages))
        self.opens_thinking_next = self.opens_thinking(prompt.ids)
        return TurnPrompt(prompt.ids, prompt.rewritten_at, self.opens_thinking_next)

    def turn(self, before: list[ChatMessage], seen: list[int], user_text: str, max_tokens: int | None) -> TurnPrompt:
        """The prompt of `user_text` after the messages `before` (whose ids are `seen`). ConversationTooLong or
        MessageTooLong (context_room.py) when it leaves a reply of at most `max_tokens` too little room."""
        prompt = self.after(seen, [*before, ChatMessage("user", user_text)])
        require_room(self.backend.context_window, max_tokens, len(prompt.ids),
                     lambda: self.tokens([ChatMessage("user", user_text)]), before, user_text)
        return prompt

    def again(self, before: list[ChatMessage], seen_through: list[int]) -> TurnPrompt:
        """The prompt of `before` once more, for a new reply to its last message: `seen_through`, the ids the
        model saw through it, when they are known; else `before` tokenized afresh."""
        ids = seen_through or self.backend.tokenizer.encode(self.text(before))
        self.opens_thinking_next = self.opens_thinking(ids)
        return TurnPrompt(ids, None, self.opens_thinking_next)

    @property
    def tool_format_notice(self) -> str | None:
        """What the user is told once of how tools reach a model whose template has no tool format (kvchat's
        convention in the system prompt); None for a template's own format, or a server (its own)."""
        if not self.takes_ids or self.tool_format.native:
            return None
        return ("This model's chat template has no tool format, so kvchat describes the tools in the system "
                "prompt and asks for calls in its own JSON convention (<tool_call>{...}</tool_call>); the grammar "
                "keeps each call valid, but a small model may call tools poorly.")

    def parse_reply(self, token_ids: list[int], opens_thinking: bool):
        """The calls a reply of `token_ids` made, in this model's format (a ParsedReply: content, calls,
        error)."""
        return self.tool_format.parse_ids(token_ids, self.tools, opens_thinking)

    def opens_thinking(self, ids: list[int]) -> bool:
        """Whether a prompt of `ids` ends inside an open <think> (R1-distill templates open it for the reply)."""
        tail = ids[-PROMPT_TAIL_TOKENS:]
        return bool(tail) and prompt_opens_thinking(self.backend.tokenizer.decode_exact(tail))
