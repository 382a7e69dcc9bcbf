"""What a chat request's tools, tool_choice, parallel_tool_calls and response_format ask of its reply.

    tools = ChatTools.of(request)                          # APIError, naming the field, for what cannot be
    text = tools.prompt(fmt, turns, chat_format)           # the prompt, through the model's ToolFormat
    grammar = tools.grammar(fmt, thinking)                 # SamplingParams.grammar, or None
    watch = tools.watch(fmt, thinking)                     # makes a candidate's CallWatch, or None

The prompt: when tools are offered or the messages hold calls or results, the model's tool format renders it
(app/tools/formats/: the template's own tool format, or kvchat's convention in the system prompt); with
tool_choice "none" the tools are not offered, but the past calls still render. Otherwise the chat template
renders the messages as it does without tools.

The grammar (every candidate's): the tool format's for the choice when tools are offered; the
response_format's (one JSON value) when not. Both at once:
- tool_choice "auto" and a json_object or json_schema format: the reply is calls, or one JSON value in the
  format (the end of an agent loop whose final answer has a schema, as OpenAI's Agents SDK asks);
- tool_choice "required" or a named tool: the call is forced and the format has no text to shape, so the
  tools' grammar alone applies (OpenAI takes both fields too; a loop's next request, with "auto", then
  answers in the format).

Refused (400, naming the field): a tool_choice other than "none" without tools; one naming a tool not
offered; two tools of one name; a tool message whose tool_call_id answers no earlier call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.chat.prompt.conversation_prompt import PROMPT_TAIL_TOKENS, response_grammar
from app.chat.prompt.formats import ChatFormat
from app.chat.prompt.template import render_chat
from app.chat.prompt.thinking import prompt_opens_thinking
from app.server.call_watch import CallWatch
from app.server.schema import APIError, ChatCompletionRequest, Message
from app.tools.formats.grammar import calls_or_value
from app.tools.formats.tool_format import ToolFormat
from app.tools.spec import ToolSpec
from app.tools.toolbox import ToolChoice
from engine.request.grammars import json_value
from engine.tokenizer.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChatTools:
    tools: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = ToolChoice()
    response_format: dict | None = None  # OpenAI's, when it asks for JSON (a "text" one asks for nothing)
    past_calls: bool = False  # the messages hold tool calls or results

    @classmethod
    def of(cls, request: ChatCompletionRequest) -> "ChatTools":
        """The request's tool use; APIError (400, naming the field) for fields that do not go together."""
        tools = tuple(tool.spec() for tool in request.tools or [])
        names = [tool.name for tool in tools]
        if len(set(names)) < len(names):
            twice = next(name for name in names if names.count(name) > 1)
            raise _invalid("tools", f"two tools are named '{twice}'; each tool needs a name of its own")
        choice = request.tool_choice
        mode = choice.function.name if choice is not None and not isinstance(choice, str) else choice or "auto"
        if not tools and choice is not None and mode != "none":
            raise _invalid("tool_choice", "a tool_choice other than 'none' needs tools; send them in 'tools'")
        if tools and mode not in ("auto", "none", "required") and mode not in names:
            raise _invalid("tool_choice", f"'{mode}' is none of the tools offered ({', '.join(names)})")
        past = _check_results(request.messages)
        response_format = request.response_format.openai() if request.response_format is not None else None
        if response_format is not None and response_format["type"] == "text":
            response_format = None
        parallel = request.parallel_tool_calls is not False
        return cls(tools, ToolChoice(mode, parallel), response_format, past)

    @property
    def offered(self) -> tuple[ToolSpec, ...]:
        """The tools the model is offered: none under tool_choice "none"."""
        return self.tools if self.choice.mode != "none" else ()

    @property
    def grammar_field(self) -> str | None:
        """The field a grammar that does not compile comes from (None: both, or neither)."""
        if self.offered:
            return "tools" if self.response_format is None or self.choice.mode != "auto" else None
        return "response_format" if self.response_format is not None else None

    def prompt(self, fmt: ToolFormat, turns: list[dict], chat_format: ChatFormat | None) -> str:
        """The prompt's text of `turns` (Message.turn's), ready for the assistant's reply."""
        if self.tools or self.past_calls:
            return fmt.render(turns, self.offered, chat_format, self.choice.parallel)
        return render_chat(fmt.tokenizer, turns, chat_format)

    def grammar(self, fmt: ToolFormat, opens_thinking: bool = False) -> str | None:
        """The grammar every candidate reply follows (the module's docstring says which), or None."""
        offered, choice = self.offered, self.choice
        if not offered:
            return None if self.response_format is None else response_grammar(self.response_format)
        if choice.mode == "auto" and self.response_format is not None:
            calls = fmt.grammar(offered, "required", choice.parallel, opens_thinking)
            return calls_or_value(calls, json_value(_schema_of(self.response_format)))
        return fmt.grammar(offered, choice.mode, choice.parallel, opens_thinking)

    def watch(self, fmt: ToolFormat, opens_thinking: bool = False) -> Callable[[], CallWatch] | None:
        """What makes each candidate's CallWatch when the model is offered tools (else None: plain text)."""
        offered = self.offered
        if not offered:
            return None
        return lambda: CallWatch(fmt, offered, opens_thinking)


def chat_turns(messages: Sequence[Message]) -> list[dict]:
    """The request's messages as the chat API's turns; a tool message without a `name` gets its call's (some
    formats write the function's name with its result)."""
    names: dict[str, str] = {}
    turns = []
    for message in messages:
        turn = message.turn()
        for call in message.tool_calls or []:
            names[call.id] = call.function.name
        if turn["role"] == "tool" and not turn.get("name"):
            turn["name"] = names.get(turn.get("tool_call_id") or "", "")
        turns.append(turn)
    return turns


def opens_thinking(tokenizer: Tokenizer, prompt_ids: list[int]) -> bool:
    """Whether a prompt ends inside an open <think> (R1-distill templates open it): its reply's grammar and
    parser then start in the reasoning."""
    return prompt_opens_thinking(tokenizer.decode_exact(prompt_ids[-PROMPT_TAIL_TOKENS:]))


def _check_results(messages: Sequence[Message]) -> bool:
    """Whether the messages hold calls or results; APIError for a result that answers no earlier call."""
    ids: set[str] = set()
    for i, message in enumerate(messages):
        ids.update(call.id for call in message.tool_calls or [])
        if message.role == "tool" and message.tool_call_id not in ids:
            raise _invalid(f"messages[{i}].tool_call_id", f"no earlier assistant message made a tool call with "
                                                          f"the id '{message.tool_call_id}'")
    return bool(ids)


def _schema_of(response_format: dict) -> dict | None:
    """The JSON schema a response_format asks for (None: any JSON object, json_object's)."""
    if response_format["type"] == "json_object":
        return None
    return response_format["json_schema"].get("schema") or {}


def _invalid(param: str, reason: str) -> APIError:
    return APIError(400, f"Invalid value for '{param}': {reason}.", param=param, code="invalid_value")
