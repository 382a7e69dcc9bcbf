"""Calls as Qwen3-Coder and Qwen3.5 write them: XML-like, one value per parameter, untyped text.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value is the text between its tags (one newline on each side belongs to the tags); the tool's schema says
what it is: a string as written, a number, a boolean, JSON for an object or an array. A value that does not
read as its type stays text (the call's check against the schema then says what is wrong).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from app.tools.formats.markup import CallGrammar, CallMarkup, MarkupError, dumps, json_rule, properties_of, schema_type
from app.tools.spec import ToolCall, ToolSpec

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/"


def typed_value(text: str, schema: dict):
    """`text` read as the type `schema` gives; the text itself when it does not read as that type."""
    kind = schema_type(schema)
    if kind == "string":
        return text
    try:
        value = json.loads(text.strip() if kind != "boolean" else text.strip().lower())
    except ValueError:
        return text
    if kind not in _READS_AS:  # untyped: JSON where it reads as JSON, else the text (Qwen writes strings unquoted)
        return value if not isinstance(value, str) else text
    return value if _READS_AS[kind](value) else text


_READS_AS = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _value_text(value) -> str:
    return value if isinstance(value, str) else dumps(value)


class QwenXmlMarkup(CallMarkup):
    name = "qwen3_xml"
    opens = ("<tool_call>",)
    closes = "</tool_call>"

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        functions = list(_FUNCTION.finditer(body))
        if not functions:
            raise MarkupError("it names no function (<function=...>)")
        schemas = {t.name: properties_of(t)[0] for t in tools}
        calls = []
        for function in functions:
            name = function[1].strip()
            properties = schemas.get(name, {})
            arguments = {}
            for parameter in _PARAMETER.finditer(function[2]):
                text = parameter[2].removeprefix("\n").removesuffix("\n")
                key = parameter[1].strip()
                arguments[key] = typed_value(text, properties.get(key, {}))
            calls.append(ToolCall(name, arguments))
        return calls

    def write(self, calls: Sequence[ToolCall]) -> str:
        written = []
        for call in calls:
            parameters = "".join(f"<parameter={key}>\n{_value_text(value)}\n</parameter>\n"
                                 for key, value in call.arguments.items())
            written.append(f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>")
        return "\n".join(written)

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        rules = [f"call_fn: {' | '.join(f'fn_{i}' for i in range(len(tools)))}"]
        for i, tool in enumerate(tools):
            rules += _function_rules(i, tool)
        one = f'"\\n<function=" call_fn "</function>\\n" {term("</tool_call>")}'
        return CallGrammar(trigger="<tool_call>", first=one, more=f'WS {term("<tool_call>")} {one}',
                           rules="\n".join(rules) + "\n")


def _function_rules(i: int, tool: ToolSpec) -> list[str]:
    """fn_<i>: the function's name and its parameters, in the schema's order, the optional ones optional."""
    properties, required = properties_of(tool)
    rules, parts = [], [json.dumps(f"{tool.name}>\n")]
    for j, (key, schema) in enumerate(properties.items()):
        rule = f"p_{i}_{j}"
        parts.append(rule if key in required else f"{rule}?")
        opening = json.dumps(f"<parameter={key}>\n")
        kind = schema_type(schema)
        if kind == "string" and isinstance(schema, dict) and "enum" in schema:
            options = " | ".join(json.dumps(str(v)) for v in schema["enum"])
            rules.append(f'{rule}: {opening} ({options}) "\\n</parameter>\\n"')
        elif kind in ("string", None):  # any text up to the closing tag
            rules.append(f"{rule}: {opening} v_{i}_{j}")
            rules.append(f'v_{i}_{j}[lazy]: /(?s:.*)/ "\\n</parameter>\\n"')
        else:
            value = {"integer": "/-?(0|[1-9][0-9]*)/", "number": NUMBER, "boolean": '("true" | "false")'}.get(kind)
            rules.append(f'{rule}: {opening} {value or json_rule(schema)} "\\n</parameter>\\n"')
    rules.insert(0, f"fn_{i}: {' '.join(parts)}")
    return rules
