"""Grammar texts for SamplingParams.grammar: llguidance's Lark dialect, written for JSON replies and tool calls.

Pure text (no torch, no llguidance), so the command line and the server can build a request's grammar
before the engine loads. The syntax is llguidance's (docs/syntax.md in its repository): Lark rules, `%json
{...}` for a value following a JSON schema, special tokens as `<|name|>` or `<[id]>`, regex lexemes `/.../`,
and in terminals `&` (both) and `~` (not).

Free text, then a call once a trigger is written (text_then_json_grammar writes it; copy the idiom):

    start: TEXT | HEAD call (WS? TRIGGER call)*
    call: WS? %json {...} WS? "</tool_call>"
    TEXT: /(?s:.*)/ & ~(/(?s:.*)/ TRIGGER /(?s:.*)/)
    HEAD: TEXT TRIGGER
    TRIGGER: "<tool_call>"
    WS: /[\\x20\\x0A\\x0D\\x09]{1,24}/

TEXT is any text that does not contain the trigger; HEAD is such text *and* the trigger, as one terminal.
That is the point: llguidance's lexer takes each lexeme as far as it goes and never backtracks into a
finished one, so with `TEXT TRIGGER` as two lexemes in a rule it holds "hi <tool_call" as TEXT and then
refuses ">". As one terminal, the text before the trigger is free, and once the trigger is complete HEAD
cannot go on, so only the JSON may follow (then the closing text, further calls, or the end). The
trigger must be text the tokenizer writes as text (Qwen's `<tool_call>` is an added token that is not
special, so it is). A trigger that is a special token (Llama's `<|python_tag|>`) is no text: free text can
never contain it and it cannot go inside a terminal, so the plain form works there:
`start: TEXT | TEXT <|python_tag|> call` with `TEXT: /(?s:.*)/`.

Whitespace is bounded everywhere (JSON_WHITESPACE): a small model that starts writing newlines inside a
JSON object could otherwise write them until max_tokens; with a bound, whitespace alone cannot keep a
reply going (an unbounded string still can: a schema's maxLength bounds that).
"""

from __future__ import annotations

import json

# What JSON's whitespace may be at each place it is allowed: enough for pretty-printing ten levels deep
# at two spaces, never a run without end.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{1,24}"
_WS_TERMINAL = f"WS: /{JSON_WHITESPACE}/"


def lark_literal(text: str) -> str:
    """`text` as a Lark string literal (JSON's escapes, which llguidance's Lark reads)."""
    return json.dumps(text, ensure_ascii=False)


def json_value(schema: dict | None = None) -> str:
    """A Lark expression (`%json {...}`) for one JSON value following `schema`; None: any JSON object (what
    OpenAI's response_format json_object asks for). Unless the schema's own `x-guidance` options say how
    whitespace goes, whitespace inside the value is bounded (JSON_WHITESPACE). ValueError for a schema
    that is not JSON data."""
    if schema is not None and not isinstance(schema, dict):
        raise ValueError("a JSON schema must be a JSON object")
    schema = {"type": "object"} if schema is None else dict(schema)
    options = schema.get("x-guidance", {})
    if isinstance(options, dict) and "whitespace_flexible" not in options and "whitespace_pattern" not in options:
        schema["x-guidance"] = {**options, "whitespace_pattern": JSON_WHITESPACE}
    try:
        return "%json " + json.dumps(schema)
    except (TypeError, ValueError):
        raise ValueError("a JSON schema must hold JSON data only") from None


def json_grammar(schema: dict | None = None) -> str:
    """A grammar for a reply that is one JSON value following `schema` (None: any JSON object), with at
    most a little whitespace before and after it."""
    return f"start: WS? {json_value(schema)} WS?\n{_WS_TERMINAL}\n"


def text_then_json_grammar(trigger: str, schema: dict | None, closing: str = "", required: bool = False) -> str:
    """A grammar for free text that does not contain `trigger`, or for text then `trigger`, a JSON value
    following `schema`, `closing`, and more such calls separated by whitespace (Hermes-style tool calls:
    `<tool_call>` ... `</tool_call>`). `required`: no text; the reply starts with a call."""
    if not trigger:
        raise ValueError("the trigger must be non-empty text")
    close = f" {lark_literal(closing)}" if closing else ""
    start = "WS? TRIGGER call (WS? TRIGGER call)*" if required else "TEXT | HEAD call (WS? TRIGGER call)*"
    return "\n".join([
        f"start: {start}",
        f"call: WS? {json_value(schema)} WS?{close}",
        "TEXT: /(?s:.*)/ & ~(/(?s:.*)/ TRIGGER /(?s:.*)/)",
        "HEAD: TEXT TRIGGER",
        f"TRIGGER: {lark_literal(trigger)}",
        _WS_TERMINAL,
        "",
    ])
