"""The OpenAI parameters `kvchat serve` does not implement, each with the values that ask for nothing it lacks.

A request that sends one of those values (many clients send such defaults: `presence_penalty: 0`,
`logprobs: false`) is served as if the field were absent; any other value is a 400 naming the field,
code `unsupported_parameter`. A field neither here nor in app/server/schema.py's models is an unknown
parameter (also a 400). When kvchat implements one, it leaves this table for a field of the request models
(tools, tool_choice, parallel_tool_calls and response_format did: app/server/tool_fields.py); the deprecated
`functions` and `function_call` stay here, refused.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticCustomError

# field -> the values accepted (and ignored); an empty tuple: none is
REQUEST: dict[str, tuple] = {
    "functions": (None, []), "function_call": (None, "none"),  # the deprecated form of tools and tool_choice
    "logprobs": (None, False), "top_logprobs": (None, 0),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,), "reasoning_effort": (None,),
    "verbosity": (None,), "web_search_options": (None,),
    "echo": (None, False), "best_of": (None, 1), "suffix": (None,),  # the text completions' own
}
# in each message (an assistant message a client sends back may carry its nulls)
MESSAGE: dict[str, tuple] = {
    "function_call": (None,),
    "refusal": (None,), "audio": (None,), "annotations": (None, []),
}
# in each content part of a message: only text parts are
CONTENT_PART: dict[str, tuple] = {"image_url": (), "input_audio": (), "file": ()}


def without_neutral_values(body: Any) -> Any:
    """`body` (a request's parsed JSON) without the unsupported fields whose values ask for nothing, in the
    request, its messages and their content parts; PydanticCustomError `unsupported_parameter` (its
    ctx's `param` names the field, e.g. messages[0].tool_calls) for the first that asks for more."""
    if not isinstance(body, dict):
        return body  # the request model refuses it
    body = _checked(body, REQUEST, "")
    if isinstance(messages := body.get("messages"), list):
        body["messages"] = [_message(m, f"messages[{i}]") if isinstance(m, dict) else m
                            for i, m in enumerate(messages)]
    return body


def _message(message: dict, where: str) -> dict:
    message = _checked(message, MESSAGE, f"{where}.")
    if isinstance(parts := message.get("content"), list):
        message["content"] = [_checked(p, CONTENT_PART, f"{where}.content[{j}].") if isinstance(p, dict) else p
                              for j, p in enumerate(parts)]
    return message


def _checked(fields: dict, table: dict[str, tuple], prefix: str) -> dict:
    kept = {}
    for name, value in fields.items():
        if name not in table:
            kept[name] = value
        elif not any(_same_json(value, neutral) for neutral in table[name]):
            accepted = " or ".join(json.dumps(neutral) for neutral in table[name])
            raise PydanticCustomError(
                "unsupported_parameter", "'{param}' is not supported by kvchat serve{accepted}.",
                {"param": prefix + name, "accepted": f" (only {accepted} is accepted)" if accepted else ""})
    return kept


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: 0 is 0.0, but false is not 0 (Python's True == 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b and isinstance(a, (int, float)) == isinstance(b, (int, float))
