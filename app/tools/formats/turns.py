"""The turns a conversation with tools gives a chat template, in the chat API's form, and the ids of calls.

- an assistant turn that called tools: {"role": "assistant", "content": ..., "tool_calls": [ToolCall.template()]}
  (its arguments a dict; an OpenAI client's turn may hold them as a JSON string, which reads too);
- a tool's result: {"role": "tool", "content": ..., "tool_call_id": ..., "name": ...}.

Each format turns these into what its template or convention wants (template_input.py, convention.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Sequence

from app.tools.spec import ToolCall, ToolResult

_ALNUM = string.ascii_letters + string.digits
MISTRAL_ID_LENGTH = 9  # Mistral's templates refuse any other id


def new_call_id() -> str:
    """A call's id as OpenAI writes them: call_ and 24 letters or digits."""
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def new_short_call_id() -> str:
    """A call's id as Mistral's templates take them: 9 letters or digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(MISTRAL_ID_LENGTH))


def short_call_id(call_id: str) -> str:
    """`call_id` as a 9-character id: itself when it is one, else one made from it, the same every time (so a
    call and its result still match, and a prompt renders the same for the prefix cache)."""
    if len(call_id) == MISTRAL_ID_LENGTH and call_id.isalnum() and call_id.isascii():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    digits = []
    for _ in range(MISTRAL_ID_LENGTH):
        number, digit = divmod(number, len(_ALNUM))
        digits.append(_ALNUM[digit])
    return "".join(digits)


def assistant_turn(content: str, calls: Sequence[ToolCall] = ()) -> dict:
    """An assistant turn that wrote `content` and called `calls` (none: a plain reply)."""
    turn = {"role": "assistant", "content": content}
    if calls:
        turn["tool_calls"] = [call.template() for call in calls]
    return turn


def tool_turn(call: ToolCall, text: str) -> dict:
    """The turn that gives the model what `call` returned."""
    return {"role": "tool", "content": text, "tool_call_id": call.id, "name": call.name}


def result_turn(result: ToolResult) -> dict:
    return tool_turn(result.call, result.text)


def turn_calls(turn: dict) -> list[ToolCall]:
    """The calls of an assistant turn (template or OpenAI form); [] for any other turn."""
    calls = []
    for item in turn.get("tool_calls") or []:
        function = item.get("function", item)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                arguments = {}
        calls.append(ToolCall(function.get("name", ""), arguments if isinstance(arguments, dict) else {},
                              item.get("id") or ""))
    return calls
