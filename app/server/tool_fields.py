"""The request fields of tool calling and structured output, in OpenAI's shapes (used by app/server/schema.py).

    tools:            [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]
    tool_choice:      "auto" | "none" | "required" | {"type": "function", "function": {"name"}}
    response_format:  {"type": "text"} | {"type": "json_object"}
                      | {"type": "json_schema", "json_schema": {"name", "schema"?, "strict"?, "description"?}}
    an assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}]

Strict like the rest of the request (schema.STRICT). A value these models refuse by its shape is a 400 naming
it; what depends on several fields (a tool_choice naming a tool not offered) is checked by
app/server/chat_tools.py. `strict` is taken and changes nothing: kvchat always holds a call's arguments, and
a json_schema reply, to its schema (the grammar masks every token that would leave it).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from app.tools.spec import ToolCall, ToolSpec

# Every request model's: JSON's types as they are, no field it does not name, numbers finite.
STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
# OpenAI's rule for a function's and a response format's name.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


def invalid_value(message: str) -> PydanticCustomError:
    """A value of the right type that cannot be taken: app/server/invalid_request.py writes it as
    "Invalid value for '<param>': <message>." (code invalid_value)."""
    return PydanticCustomError("invalid_value", message)


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # the arguments' JSON schema; none: the tool takes no arguments
    strict: bool | None = None


class FunctionTool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition

    def spec(self) -> ToolSpec:
        function = self.function
        return ToolSpec(function.name, function.description or "", function.parameters or {})


class FunctionName(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    """tool_choice {"type": "function", "function": {"name": ...}}: a call of that tool."""

    model_config = STRICT

    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=NAME_PATTERN)
    # `schema` is a BaseModel method's name: the field is named otherwise and read by its alias
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, validate_default=True)

    @field_validator("json_schema")
    @classmethod
    def _schema_with_its_type(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("type")
        if value is None and kind == "json_schema":
            raise PydanticCustomError("missing", "Field required")
        if value is not None and kind in ("text", "json_object"):
            raise invalid_value(f"a json_schema goes with the type json_schema, not {kind}")
        return value

    def openai(self) -> dict:
        """The dict app/chat/prompt/conversation_prompt.py's response_grammar takes."""
        if self.json_schema is None:
            return {"type": self.type}
        return {"type": self.type, "json_schema": {"name": self.json_schema.name,
                                                   "schema": self.json_schema.json_schema or {}}}


class CalledFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str  # OpenAI's: the arguments' JSON text

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: str) -> str:
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise invalid_value("the arguments must be a JSON object written as a string; this is not valid JSON") \
                from None
        if not isinstance(value, dict):
            raise invalid_value("the arguments must be a JSON object written as a string")
        return arguments


class MessageToolCall(BaseModel):
    """A call an assistant message made, sent back with the conversation."""

    model_config = STRICT

    id: str
    type: Literal["function"]
    function: CalledFunction

    def call(self) -> ToolCall:
        arguments = self.function.arguments
        return ToolCall(self.function.name, json.loads(arguments) if arguments.strip() else {}, self.id)
