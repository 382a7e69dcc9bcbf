"""The three values every part of tool calling shares: a tool the model is offered, a call it makes, and
what the call returned. Plain data: the chat session, the MCP client, the formats and `kvchat serve`
pass them to each other, and they are stored with the conversation as JSON (to_json / from_json)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolSpec:
    """A function the model is offered, as OpenAI's API and chat templates describe one."""

    name: str
    description: str = ""
    # The arguments' JSON schema (an object schema); {} when the tool takes none.
    parameters: dict = field(default_factory=dict, hash=False, compare=False)
    server: str | None = None  # the MCP server that runs it (None: the API's caller runs it)

    def openai(self) -> dict:
        """The {"type": "function", "function": {...}} form templates and OpenAI's API take."""
        parameters = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": parameters}}


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: the function's name and its arguments (a JSON object, parsed)."""

    name: str
    arguments: dict = field(hash=False, compare=True)
    id: str = ""  # the call's id, for the tool message that answers it (OpenAI's tool_call_id)

    def openai(self) -> dict:
        """OpenAI's {"id", "type": "function", "function": {"name", "arguments": <JSON text>}} form."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}

    def template(self) -> dict:
        """The form chat templates read in an assistant message's `tool_calls` (arguments as a dict:
        Qwen's and Llama's templates dump them themselves)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolResult:
    """What running a call gave: text for the model (already made safe and cut to its budget), whether it
    failed (the text then says why, in one sentence), and how long it took."""

    call: ToolCall
    text: str
    is_error: bool = False
    ms: float = 0.0
    truncated: bool = False  # the result was longer than its budget and was cut (the text says so)


def once_each(calls: list[ToolCall]) -> list[ToolCall]:
    """`calls` without the repeats of a call already made (same name and arguments), in order, the first's id
    kept: a small model forced to call writes the same call again (the chat and the server end the reply there)."""
    seen: dict[tuple[str, str], ToolCall] = {}
    for call in calls:
        seen.setdefault((call.name, json.dumps(call.arguments, sort_keys=True)), call)
    return list(seen.values())

