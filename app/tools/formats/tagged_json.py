"""Calls written as JSON between a pair of markers.

- Hermes, as Qwen2.5, Qwen3, SmolLM3 and NousResearch's Hermes write it, and kvchat's own convention
  (convention.py): each call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several one
  after another. In Qwen's vocabularies the markers are added tokens, in SmolLM2's plain text.
- Phi-4-mini: every call in one JSON list, `<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>`
  (its markers are special tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.tools.formats.markup import (CallGrammar, CallMarkup, call_list_schema, calls_schema, dumps, json_calls,
                                      json_rule)
from app.tools.spec import ToolCall, ToolSpec


class HermesMarkup(CallMarkup):
    name = "hermes"
    opens = ("<tool_call>",)
    closes = "</tool_call>"

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        return json_calls(body)

    def write(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"<tool_call>\n{dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>"
                         for c in calls)

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        one = f'"\\n" call_json "\\n" {term("</tool_call>")}'
        return CallGrammar(trigger="<tool_call>", first=one, more=f'WS {term("<tool_call>")} {one}',
                           rules=f"call_json: {json_rule(calls_schema(tools))}\n")


class Phi4MiniMarkup(CallMarkup):
    name = "phi4_mini"
    opens = ("<|tool_call|>",)
    closes = "<|/tool_call|>"

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        return json_calls(body, "the text of its calls")

    def write(self, calls: Sequence[ToolCall]) -> str:
        return "<|tool_call|>" + dumps([{"name": c.name, "arguments": c.arguments} for c in calls]) + "<|/tool_call|>"

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        return CallGrammar(trigger="<|tool_call|>", first=f'call_list {term("<|/tool_call|>")}', more=None,
                           rules=f"call_list: {json_rule(call_list_schema(tools, parallel))}\n")
