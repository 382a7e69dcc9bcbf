"""Calls as LFM2 writes them: a Python list of calls with keyword arguments between special tokens,

    <|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>

Values are Python literals (JSON's true/false/null read too); llama.cpp's LFM2 template writes a JSON list
of {"name", "arguments"} objects there instead, which reads as well.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence

from app.tools.formats.markup import (CallGrammar, CallMarkup, MarkupError, json_calls, json_rule, properties_of,
                                      schema_type)
from app.tools.formats.xml_markup import NUMBER
from app.tools.spec import ToolCall, ToolSpec

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
STRING = r"""/"([^"\\\n]|\\.)*"|'([^'\\\n]|\\.)*'/"""


class PythonicMarkup(CallMarkup):
    name = "lfm2"
    opens = (START,)
    closes = END

    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        text = body.strip()
        if text.startswith(("[{", "{")):
            return json_calls(text, "the text of its calls")
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            raise MarkupError("the text of its calls is not a Python list of calls") from None
        nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
        if not nodes:
            raise MarkupError("its list of calls is empty")
        return [_call(node) for node in nodes]

    def write(self, calls: Sequence[ToolCall]) -> str:
        written = (f"{c.name}({', '.join(f'{k}={python_literal(v)}' for k, v in c.arguments.items())})" for c in calls)
        return f"{START}[{', '.join(written)}]{END}"

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        rules = [f"call_py: {' | '.join(f'fn_{i}' for i in range(len(tools)))}", f"PY_STRING: {STRING}"]
        for i, tool in enumerate(tools):
            rules += _function_rules(i, tool)
        calls = '"[" call_py ("," " "? call_py)* "]"' if parallel else '"[" call_py "]"'
        return CallGrammar(trigger=START, first=f"{calls} {term(END)}", more=None, rules="\n".join(rules) + "\n")


def _call(node) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise MarkupError("an item of its list is not a call")
    name = _dotted(node.func)
    if node.args or any(k.arg is None for k in node.keywords):
        raise MarkupError(f"its call to {name} passes arguments without their names")
    return ToolCall(name, {k.arg: _literal(k.value, name) for k in node.keywords})


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise MarkupError("a call in it names no function")


def _literal(node, name: str):
    """A Python literal's value; JSON's true, false and null read as Python's."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item, name) for item in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k, name): _literal(v, name) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    raise MarkupError(f"an argument of its call to {name} is not a literal value")


def python_literal(value) -> str:
    """`value` (JSON data) as a Python literal, strings double-quoted as LFM2 writes them."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _function_rules(i: int, tool: ToolSpec) -> list[str]:
    """fn_<i>: `name(k=v, ...)`, the keywords in the schema's order, the required ones present.
    a_<i>_<j>_first / a_<i>_<j>_more: the arguments from the j-th on, before any / after one (a comma first)."""
    schemas, required = properties_of(tool)
    properties = list(schemas.items())
    rules = [f'fn_{i}: {json.dumps(tool.name + "(")} a_{i}_0_first ")"']
    for j, (key, schema) in enumerate(properties):
        rules.append(f"kw_{i}_{j}: {json.dumps(key + '=')} {_value(schema)}")
        for first in (True, False):
            here = f"a_{i}_{j}_{'first' if first else 'more'}"
            comma = "" if first else '", " '
            written = f"{comma}kw_{i}_{j} a_{i}_{j + 1}_more"
            skipped = f"a_{i}_{j + 1}_{'first' if first else 'more'}"
            rules.append(f"{here}: {written}" if key in required else f"{here}: {written} | {skipped}")
    end = len(properties)
    rules += [f'a_{i}_{end}_first: ""', f'a_{i}_{end}_more: ""']
    return rules


def _value(schema: dict) -> str:
    kind = schema_type(schema)
    if kind == "string" and isinstance(schema, dict) and "enum" in schema:
        return "(" + " | ".join(json.dumps(json.dumps(str(v))) for v in schema["enum"]) + ")"
    return {"string": "PY_STRING", "integer": "/-?(0|[1-9][0-9]*)/", "number": NUMBER,
            "boolean": '("True" | "False" | "true" | "false")'}.get(kind) or json_rule(schema)
