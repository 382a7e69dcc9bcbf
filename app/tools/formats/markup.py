"""How a model family writes tool calls in its reply text: the markup that opens a call and the one that
closes it, how the text between reads as calls, how calls are written back as the model writes them, and the
Lark rules that constrain them (grammar.py builds a whole reply's grammar from those).

The text here is the reply as its tokens decode with special tokens kept (Tokenizer.decode_exact): many
families' markers are special tokens ([TOOL_CALLS], <|python_tag|>, <|tool_call_start|>), which the text the
chat shows leaves out. stream_parser.py cuts a reply into plain text and call regions with `opens`/`closes`;
a family module reads a region's body."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from app.tools.spec import ToolCall, ToolSpec


class MarkupError(ValueError):
    """A call's markup that cannot be read; the message says why, as the end of a sentence ("its arguments
    are not valid JSON")."""


@dataclass
class Region:
    """One stretch of call markup in a reply, as stream_parser.py cut it out: the text that opened it, its
    body, and the text that closed it ("" while open, or when the reply ended inside it)."""

    opener: str
    body: str = ""
    closer: str = ""
    at: int = 0  # where it stood in the reply's text outside regions (its length when the region opened)

    @property
    def raw(self) -> str:
        return self.opener + self.body + self.closer


@dataclass(frozen=True)
class CallGrammar:
    """A family's calls as Lark, for grammar.py: the text that opens the first call, what follows it through
    that call's end, and (when calls may follow one another) one more call, its own opener included."""

    trigger: str  # the opening markup's text (grammar.py writes it as a token where the vocabulary has one)
    first: str  # Lark: what follows the trigger, through the first call's end
    more: str | None  # Lark: one more call; None where one piece of markup holds every call (a JSON list)
    rules: str  # the named rules and terminals the two refer to
    bare: bool = False  # the first call may also open the answer with no trigger (Llama's bare JSON)


class CallMarkup(ABC):
    """One family's call markup. Subclasses set the class attributes and read/write/constrain a body."""

    name: str
    opens: tuple[str, ...]  # texts that open a call region
    closes: str | None  # the text that closes one; None: a region runs to the reply's end
    # Special tokens that belong inside a body ([ARGS] of Mistral's); others (an end-of-turn token the reply
    # stops on) are taken out before a body is read.
    structural: tuple[str, ...] = ()

    def opens_at_start(self, text: str) -> bool | None:
        """Whether the reply's answer opens with a call that has no opening marker (Llama's bare JSON): True,
        False, or None while `text` (its start so far, leading whitespace kept) cannot tell yet. Such a call's
        text is all body."""
        return False

    @abstractmethod
    def parse(self, body: str, tools: Sequence[ToolSpec], opener: str = "") -> list[ToolCall]:
        """The calls in one region's `body` (ids left empty); MarkupError when it does not read as calls.
        `opener`: the text that opened the region (harmony's header names the function)."""

    @abstractmethod
    def write(self, calls: Sequence[ToolCall]) -> str:
        """`calls` as the model writes them, markers included."""

    @abstractmethod
    def grammar(self, tools: Sequence[ToolSpec], parallel: bool, term) -> CallGrammar:
        """The Lark of calls to `tools` (one, or several when `parallel`); `term(text)` writes a marker as
        Lark (a token reference when the vocabulary has it as one token, else a string)."""

    def reply_grammar(self, tools: Sequence[ToolSpec], required: bool, parallel: bool, term) -> str | None:
        """A whole reply's Lark where the family's replies have a shape of their own (harmony's messages);
        None: grammar.py builds it from `grammar` (free text, then calls)."""
        return None


def arguments_of(value, name: str) -> dict:
    """A call's arguments as written: a JSON object, or a string holding one (OpenAI's own form);
    MarkupError otherwise."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise MarkupError(f"the arguments of its call to {name} are not valid JSON") from None
    if not isinstance(value, dict):
        raise MarkupError(f"the arguments of its call to {name} are not a JSON object")
    return value


def call_of(obj, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall:
    """A call from the JSON object a model wrote: {"name", "arguments"} (or "parameters"), an OpenAI-style
    {"function": {...}} wrapper, an "id" kept where present."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = {**obj["function"], "id": obj.get("id", "")}
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise MarkupError("a call in it names no function")
    key = next((k for k in argument_keys if k in obj), None)
    arguments = arguments_of(obj.get(key) if key else None, obj["name"])
    call_id = obj.get("id")
    return ToolCall(obj["name"], arguments, call_id if isinstance(call_id, str) else "")


def json_calls(text: str, what: str = "the text of its call") -> list[ToolCall]:
    """The calls in JSON text: one call object or a list of them (anything after the JSON is let be: a model
    may close a brace too many). MarkupError naming `what` when it does not read."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        raise MarkupError(f"{what} is not valid JSON") from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise MarkupError("its list of calls is empty")
    return [call_of(item) for item in items]


def dumps(value) -> str:
    """JSON as chat templates write it (json.dumps' default separators, characters kept as they are)."""
    return json.dumps(value, ensure_ascii=False)


def schema_type(schema: dict) -> str | None:
    """A parameter schema's type ("string", "integer"...), the first not null of a list; None: untyped."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return kind if isinstance(kind, str) else None


def parameters_of(tool: ToolSpec) -> dict:
    """The JSON schema of `tool`'s arguments (an empty object's when it takes none)."""
    return tool.openai()["function"]["parameters"]


def arguments_schema(tool: ToolSpec) -> dict:
    """The schema a call's arguments are held to by the grammar: the tool's, closed to arguments it does not
    name unless it says otherwise (additionalProperties), as OpenAI's strict mode closes them. Left open, a
    small model invents an argument and writes its value until its token limit (seen: a tool without
    arguments, called with "text": "This is a paint. This is a paint. ..."); no tool reads one it never named."""
    parameters = parameters_of(tool)
    if parameters.get("type") == "object" and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def properties_of(tool: ToolSpec) -> tuple[dict, set[str]]:
    """`tool`'s arguments: their schemas by name, in the schema's order, and the names of the required ones."""
    parameters = parameters_of(tool)
    return parameters.get("properties") or {}, set(parameters.get("required") or [])


def call_schema(tool: ToolSpec, arguments_key: str = "arguments") -> dict:
    """The JSON schema of one call object to `tool`: its name, and arguments following its parameters."""
    return {"type": "object", "properties": {"name": {"const": tool.name}, arguments_key: arguments_schema(tool)},
            "required": ["name", arguments_key], "additionalProperties": False}


def calls_schema(tools: Sequence[ToolSpec], arguments_key: str = "arguments") -> dict:
    """One call object to any of `tools`."""
    options = [call_schema(t, arguments_key) for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_list_schema(tools: Sequence[ToolSpec], parallel: bool) -> dict:
    """A JSON list of calls to `tools`: at least one, at most one unless `parallel`."""
    return {"type": "array", "items": calls_schema(tools), "minItems": 1, **({} if parallel else {"maxItems": 1})}


def json_rule(schema: dict) -> str:
    """A Lark expression matching JSON that follows `schema` (llguidance's inline %json)."""
    return "%json " + json.dumps(schema)


def partial_marker(text: str, markers) -> int:
    """The length of the longest end of `text` that is a proper start of one of `markers` (0: none): text a
    streaming reader holds back until the next piece says whether a marker begins there."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-length:]):
                longest = length
                break
    return longest
