"""Calls as Llama 3.1, 3.2 and 3.3 write them: a reply that is a JSON object, `{"name": ..., "parameters":
{...}}`, sometimes after `<|python_tag|>` (a special token), several separated by `;`.

With no marker before it, a call is known by how the answer opens: `{` and then the key "name". A reply that
merely starts with some other JSON is text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from app.tools.formats.markup import CallGrammar, CallMarkup, MarkupError, call_of, calls_schema, dumps, json_rule
from app.tools.spec import ToolCall, ToolSpec

_NAME_KEY = '"name"'


class LlamaJsonMarkup(CallMarkup):
    name = "llama3_json"
    opens = ("<|python_tag|>",)
    closes = None

    def opens_at_start(self, text: str) -> bool | None:
        start = text.lstrip()
        if not start:
            return None
        if start[0] != "{":
            return False
        key = start[1:].lstrip()
        if len(key) < len(_NAME_KEY):
            return None if _NAME_KEY.startswith(key) else False
        return key.startswith(_NAME_KEY)

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        decoder, at, calls = json.JSONDecoder(), 0, []
        while True:
            while at < len(body) and (body[at].isspace() or body[at] == ";"):
                at += 1
            if at == len(body):
                break
            try:
                value, at = decoder.raw_decode(body, at)
            except ValueError:
                raise MarkupError("the text of its call is not valid JSON") from None
            items = value if isinstance(value, list) else [value]
            calls += [call_of(item, ("parameters", "arguments")) for item in items]
        if not calls:
            raise MarkupError("it holds no call")
        return calls

    def write(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(dumps({"name": c.name, "parameters": c.arguments}) for c in calls)

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        return CallGrammar(trigger="<|python_tag|>", first="call_json", more='";" WS call_json', bare=True,
                           rules=f"call_json: {json_rule(calls_schema(tools, 'parameters'))}\n")
