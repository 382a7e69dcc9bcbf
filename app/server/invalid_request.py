"""One sentence, the parameter and OpenAI's error code for a request the models of app/server/schema.py refuse.

    Invalid type for 'max_tokens': expected an integer, but got a string instead.   (invalid_type)
    Unknown parameter: 'messages[0].foo'.                                           (unknown_parameter)
    'tools' is not supported by kvchat serve (only null or [] is accepted).          (unsupported_parameter)
    Missing required parameter: 'messages[1].content'.                              (missing_required_parameter)
    Invalid value for 'tool_choice': expected 'auto', 'none' or 'required' or an object, but got "any".
                                                                                     (invalid_value)

Parameters are named as OpenAI names them: `messages[0].content`, not pydantic's locations
("body", "messages", 0, "content", "str"), whose union members' tags are left out.
"""

from __future__ import annotations

import json

from app.server import tool_fields
from app.server.schema import APIError, ChatCompletionRequest, CompletionRequest, ContentPart, Message, StreamOptions

_MODELS = (ChatCompletionRequest, CompletionRequest, Message, ContentPart, StreamOptions, tool_fields.FunctionTool,
           tool_fields.FunctionDefinition, tool_fields.NamedToolChoice, tool_fields.FunctionName,
           tool_fields.ResponseFormat, tool_fields.JsonSchemaFormat, tool_fields.MessageToolCall,
           tool_fields.CalledFunction)
_FIELDS = {field.alias or name for model in _MODELS for name, field in model.model_fields.items()}
# pydantic's type errors -> what the field takes
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean", "string_type": "a string",
             "list_type": "an array", "dict_type": "an object", "model_type": "an object",
             "model_attributes_type": "an object"}


def json_type(value: object) -> str:
    """What a parsed JSON value is, in words: 'a string', 'a decimal number', 'null', ..."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a decimal number"), (str, "a string"),
             (list, "an array"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def param_of(loc: tuple, extra: bool = False) -> str | None:
    """`messages[0].content` for pydantic's ("body", "messages", 0, "content", "list[ContentPart]"): the tags
    of a union's members are not fields. `extra`: the last part is a field the models do not name."""
    path = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _FIELDS or (extra and i == len(loc) - 1):
            path += f".{part}" if path else part
    return path or None


def validation_error(errors: list[dict]) -> APIError:
    """The 400 for pydantic's (FastAPI's) validation errors: the deepest one's (a union's members fail
    together, and the member that got furthest says most), the types a union takes joined."""
    if not errors:
        return APIError(400, "The request is invalid.")
    if errors[0].get("type") == "json_invalid":
        detail = (errors[0].get("ctx") or {}).get("error", "")
        return APIError(400, f"The request body is not valid JSON ({detail}).".replace(" ()", ""))
    params = [param_of(e.get("loc", ()), extra=e.get("type") == "extra_forbidden") for e in errors]
    param = max(params, key=lambda p: p.count(".") + p.count("[") if p else -1)
    same = [e for e, p in zip(errors, params) if p == param]
    first, kind = same[0], same[0].get("type")
    if kind == "unsupported_parameter":  # app/server/unsupported.py's, raised before any field is read
        return APIError(400, first["msg"], param=first["ctx"]["param"], code="unsupported_parameter")
    if param is None and kind == "missing":
        return APIError(400, "The request body is empty; send a JSON object.")
    if param is None and kind in _EXPECTED:
        return APIError(400, f"The request body must be a JSON object, not {json_type(first.get('input'))}.")
    if param is None:
        return APIError(400, f"The request body is invalid: {first.get('msg', 'invalid request')}.")
    if kind == "extra_forbidden":
        return APIError(400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if kind in _EXPECTED:
        expected = " or ".join(dict.fromkeys(_EXPECTED[e["type"]] for e in same if e.get("type") in _EXPECTED))
        got = json_type(first.get("input"))
        return APIError(400, f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param=param,
                        code="invalid_type")
    if kind == "invalid_value":  # app/server/tool_fields.py's own
        return APIError(400, f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value")
    if kind == "literal_error":  # the literal's values, and the types the union's other members take
        expected = [e["ctx"]["expected"] for e in same if e.get("type") == "literal_error"]
        expected += [_EXPECTED[e["type"]] for e in same if e.get("type") in _EXPECTED]
        return APIError(400, f"Invalid value for '{param}': expected {' or '.join(dict.fromkeys(expected))}, but got "
                             f"{json.dumps(first.get('input'))}.", param=param, code="invalid_value")
    if kind == "string_pattern_mismatch":  # a function's or a response format's name
        return APIError(400, f"Invalid value for '{param}': {json.dumps(first.get('input'))} is not a name of 1 to 64 "
                             f"letters, digits, underscores and dashes.", param=param, code="invalid_value")
    if kind == "finite_number":  # NaN and Infinity, which Python's JSON parser reads
        return APIError(400, f"Invalid value for '{param}': expected a finite number, but got "
                             f"{json.dumps(first.get('input'))} instead.", param=param, code="invalid_value")
    return APIError(400, f"Invalid '{param}': {first.get('msg')}.", param=param)
