"""Calls as Mistral's models write them, after the special token [TOOL_CALLS], to the reply's end.

- Before tokenizer v11 (Mistral 7B v0.3, Nemo): a JSON list, `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
  (the template writes each past call's 9-character id into its object).
- From v11 (Mistral Small 3.x, Ministral 3, Devstral): one `[TOOL_CALLS]name[ARGS]{...}` per call; a template
  may write `[CALL_ID]id` before `[ARGS]`. A vocabulary with the [ARGS] token is of this kind.

Both readings are tried on any body, whichever the vocabulary: a model fine-tuned across versions may write either.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from app.tools.formats.markup import (CallGrammar, CallMarkup, MarkupError, arguments_of, call_list_schema, dumps,
                                      arguments_schema, json_calls, json_rule)
from app.tools.spec import ToolCall, ToolSpec

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


class MistralMarkup(CallMarkup):
    opens = (TOOL_CALLS,)
    closes = None
    structural = (TOOL_CALLS, ARGS, CALL_ID)

    def __init__(self, args_token: bool):
        self.args_token = args_token  # v11+: name[ARGS]{...}; else a JSON list
        self.name = "mistral_v11" if args_token else "mistral"

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        calls = []
        for part in (p.strip() for p in body.split(TOOL_CALLS)):
            if part:
                calls += json_calls(part, "the text of its calls") if part[0] in "[{" else [_named_call(part)]
        if not calls:
            raise MarkupError("it holds no call")
        return calls

    def write(self, calls: Sequence[ToolCall]) -> str:
        if self.args_token:
            return "".join(f"{TOOL_CALLS}{c.name}{ARGS}{dumps(c.arguments)}" for c in calls)
        return TOOL_CALLS + dumps([{"name": c.name, "arguments": c.arguments} for c in calls])

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        if not self.args_token:
            rules = f"call_list: {json_rule(call_list_schema(tools, parallel))}\n"
            return CallGrammar(trigger=TOOL_CALLS, first="call_list", more=None, rules=rules)
        rules = [f"call_fn: {' | '.join(f'fn_{i}' for i in range(len(tools)))}"]
        for i, tool in enumerate(tools):
            rules.append(f"fn_{i}: {json.dumps(tool.name)} ({term(CALL_ID)} /[A-Za-z0-9]{{9}}/)? {term(ARGS)} "
                         f"{json_rule(arguments_schema(tool))}")
        return CallGrammar(trigger=TOOL_CALLS, first="call_fn", more=f"{term(TOOL_CALLS)} call_fn",
                           rules="\n".join(rules) + "\n")


def _named_call(text: str) -> ToolCall:
    """`name[ARGS]{...}` (or `name[CALL_ID]id[ARGS]{...}`, or `name{...}`)."""
    head, marker, arguments = text.partition(ARGS)
    if not marker:
        brace = text.find("{")
        head, arguments = (text, "") if brace < 0 else (text[:brace], text[brace:])
    name, _, call_id = (part.strip() for part in head.partition(CALL_ID))
    if not name or any(c in name for c in "{}[]\"' \n"):
        raise MarkupError("a call in it names no function")
    try:
        value, _ = json.JSONDecoder().raw_decode(arguments.strip()) if arguments.strip() else ({}, 0)
    except ValueError:
        raise MarkupError(f"the arguments of its call to {name} are not valid JSON") from None
    return ToolCall(name, arguments_of(value, name), call_id)
