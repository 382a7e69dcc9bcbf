"""How a conversation keeps tool calling in its messages (ChatMessage.tools, stored as messages.tools) and how
those messages become the chat API's turns a template renders:

- a reply that made calls: {"calls": [{"id", "name", "arguments"}]}; its text is what it said besides the
  calls (the call markup is the format's to write again: app/tools/formats/);
- a tool message (role "tool"), one per call: {"call": {...}, "ms", "is_error", "truncated", "server"}; its
  text is the result as the model reads it.
"""

from __future__ import annotations

from app.tools.formats.turns import assistant_turn, tool_turn
from app.tools.spec import ToolCall, ToolResult


def reply_tools(calls: list[ToolCall]) -> dict | None:
    """What a reply's row keeps of the calls it made (None: it made none)."""
    if not calls:
        return None
    return {"calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]}


def calls_of(tools: dict | None) -> list[ToolCall]:
    """The calls a reply's `tools` record holds ([] for any other message)."""
    if not tools or "calls" not in tools:
        return []
    return [ToolCall(c["name"], c.get("arguments") or {}, c.get("id", "")) for c in tools["calls"]]


def result_tools(result: ToolResult, server: str | None = None) -> dict:
    """What a tool message's row keeps of its call and how it went."""
    call = result.call
    return {"call": {"id": call.id, "name": call.name, "arguments": call.arguments}, "ms": round(result.ms, 1),
            "is_error": result.is_error, "truncated": result.truncated, "server": server}


def call_of_result(tools: dict | None) -> ToolCall | None:
    """The call a tool message answers (None for any other message)."""
    if not tools or "call" not in tools:
        return None
    c = tools["call"]
    return ToolCall(c["name"], c.get("arguments") or {}, c.get("id", ""))


def template_turn(role: str, content: str, tools: dict | None) -> dict:
    """A message as the chat API's turn: a reply with its `tool_calls`, a tool result with the id and name of
    the call it answers (templates read either: Llama's the name, Mistral's the id), any other as it was."""
    if role == "assistant" and (calls := calls_of(tools)):
        return assistant_turn(content, calls)
    if role == "tool":
        return tool_turn(call_of_result(tools) or ToolCall("", {}), content)
    return {"role": role, "content": content}
