"""A reply's llguidance Lark grammar when tools are offered, from its family's call markup (markup.py).

The tool choice (OpenAI's tool_choice) says what the reply may be:
- "auto": free text, or free text and then calls (one, or several when `parallel`);
- "required": calls from the first token (after any thinking);
- a tool's name (or OpenAI's {"type": "function", "function": {"name": ...}}): calls to that tool only;
- "none": no grammar (None): the tools are not offered at all.
Each call's arguments follow its tool's JSON schema (llguidance's inline `%json`).

How a marker is written: llguidance reads every added token of a vocabulary as a token of its own (its bytes
never come from plain text), so a marker that is one token is written as that token (`<[id]>`). A marker that
is plain text (kvchat's convention on SmolLM2) opens calls through a lazy lexeme: any text up to the first
`<tool_call>`; a reply without a call is then text that never holds the marker.

A model that thinks first (its vocabulary has a <think> token, or its prompt opens the thinking) may write its
reasoning before anything else, markers and all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from app.chat.prompt.thinking import THINK_CLOSE, THINK_OPEN
from app.tools.formats.markup import CallMarkup
from app.tools.spec import ToolSpec

WS = "WS: /[ \\t\\n]*/"
# What a reply's text may never hold when its markers are plain text (kvchat's convention): a tool's result is
# the chat's to write. Unconstrained, the bundled 135M model wrote "<tool_response>" and a made-up result after a
# real one, to its token limit.
RESULT_MARKER = "<tool_response"  # with or without the name the convention gives each
CHOICES = ("auto", "required", "none")


class Terms:
    """Markers as Lark for one tokenizer: a token reference where the vocabulary holds the marker as one added
    token, else a string."""

    def __init__(self, tokenizer):
        self._added = {text: token for token, (text, _) in tokenizer.added_tokens().items()}

    def is_token(self, text: str) -> bool:
        return text in self._added

    def other_tokens(self, text: str) -> str:
        """Lark for any one token but the token `text` (which must be one)."""
        return f"<[^{self._added[text]}]>"

    def __call__(self, text: str) -> str:
        token = self._added.get(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)


def chosen_tools(tools: Sequence[ToolSpec], choice) -> tuple[list[ToolSpec], bool]:
    """The tools a reply may call under `choice`, and whether it must call one. ValueError for a choice that
    names no offered tool."""
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name") or choice.get("type")
    if choice in ("auto", "required"):
        return list(tools), choice == "required"
    named = [tool for tool in tools if tool.name == choice]
    if not named:
        raise ValueError(f"The tool choice {choice!r} names none of the tools offered.")
    return named, True


def reply_grammar(markup: CallMarkup, terms: Terms, tools: Sequence[ToolSpec], choice="auto", parallel: bool = True,
                  opens_in_thinking: bool = False) -> str | None:
    """The Lark grammar of a reply that may (or must) call `tools`; None for choice "none" or no tools."""
    if choice == "none" or not tools:
        return None
    tools, required = chosen_tools(tools, choice)
    whole = markup.reply_grammar(tools, required, parallel, terms)
    if whole is not None:
        return whole
    call = markup.grammar(tools, parallel, terms)
    calls = f"{call.first} ({call.more})*" if parallel and call.more else call.first
    think, think_rules = _thinking(terms, opens_in_thinking)
    trigger = terms(call.trigger)
    if required:
        rules = [f"start: {think}WS {trigger}{'?' * call.bare} {calls} WS"]
    elif terms.is_token(call.trigger):
        # The free text is bytes, which never make the trigger token; where a call may open the answer with no
        # trigger (Llama's), an answer that opens like one (a `{`) must be one.
        text = "/(?s:.*)/ & ~/[ \\t\\n]*\\{(?s:.*)/" if call.bare else "/(?s:.*)/"
        bare = f" | {think}WS {calls} WS" if call.bare else ""
        rules = [f"start: {think}TEXT | {think}TEXT {trigger} {calls} WS{bare}", f"TEXT: {text}"]
    else:  # a text trigger: any text up to its first occurrence (lazy), or text that never holds it
        escaped, result = (re.escape(text).replace("/", "\\/") for text in (call.trigger, RESULT_MARKER))
        free = f"/(?s:.*)/ & ~/(?s:.*){result}(?s:.*)/"
        rules = [f"start: {think}TAIL | {think}head {calls} WS", f"TAIL: {free} & ~/(?s:.*){escaped}(?s:.*)/",
                 f"head[lazy]: FREE {trigger}", f"FREE: {free}"]
    return "\n".join([*rules, WS, *think_rules, call.rules.rstrip("\n")]) + "\n"


def _thinking(terms: Terms, opens_in_thinking: bool) -> tuple[str, list[str]]:
    """What may come before the answer ("" or a rule and a space), and the rules it needs."""
    if not (opens_in_thinking or terms.is_token(THINK_OPEN)):
        return "", []
    close = terms(THINK_CLOSE)
    if terms.is_token(THINK_CLOSE):  # any token but the closing one (reasoning may write a marker's token)
        body = f"{terms.other_tokens(THINK_CLOSE)}*"
        if opens_in_thinking:
            return "think ", [f"think: {body} {close}"]
        return "think? ", [f"think: {terms(THINK_OPEN)} {body} {close}"]
    if opens_in_thinking:
        return "think ", [f"think[lazy]: /(?s:.*)/ {close}"]
    return "think? ", [f"think[lazy]: {terms(THINK_OPEN)} /(?s:.*)/ {close}"]


def calls_or_value(calls_grammar: str, value: str) -> str:
    """A grammar for a reply that is either what `calls_grammar` accepts (a reply_grammar whose calls are
    required) or one JSON value, `value` (engine/request/grammars.py's json_value: `%json {...}`): tools under
    "auto" with a response_format that asks for JSON. The calls' grammar keeps its rules; its start is renamed."""
    calls = re.sub(r"^start:", "calls_reply:", calls_grammar, count=1, flags=re.MULTILINE)
    return f"start: calls_reply | value_reply\nvalue_reply: {value}\n{calls}"
