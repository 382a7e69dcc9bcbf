"""kvchat's own way of offering tools, for a model whose chat template has no tool format (the bundled
SmolLM2-135M-Instruct, Gemma 3, any template that never reads `tools`) or that has no template at all (a
standard format, app/chat/prompt/formats.py). Its wording is written here once.

- The tools are described in the system prompt: what tool calling is, each tool as a JSON line (its name, what
  it does, the JSON schema of its arguments), how to call one and the rules a small model needs spelled out.
- A call is asked for as Hermes-style models write it (tagged_json.HermesMarkup), so the same reader, writer
  and grammar serve it:
      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>
- A past call is written back into its assistant turn as that markup, after the turn's text.
- Results come back as one user turn per reply, each result a `<tool_response name="...">` block: every template
  knows the user role (Gemma's would write an unknown "tool" role as is, and refuses turns that do not
  alternate), and one turn holding all of a reply's results (and a message the user sent before the model
  answered them) keeps user and assistant turns alternating.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.tools.formats.markup import dumps, properties_of, schema_type
from app.tools.formats.tagged_json import HermesMarkup
from app.tools.formats.turns import turn_calls
from app.tools.spec import ToolCall, ToolSpec

MARKUP = HermesMarkup()
_PLACEHOLDERS = {"string": "...", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}


def instructions(tools: Sequence[ToolSpec], parallel: bool = True) -> str:
    """The system prompt's part that offers `tools`."""
    listed = "\n".join(dumps(tool.openai()["function"]) for tool in tools)
    several = ("To call several tools at once, write one <tool_call> block for each, one after the other."
               if parallel else "Call one tool at a time: a single <tool_call> block per reply.")
    return (
        "# Tools\n\n"
        "You can call tools (functions) to get information or to do things. Each tool is one line of JSON "
        "below: its name, what it does, and the JSON schema of its arguments.\n\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "To call a tool, reply with a <tool_call> block like this one, with the real values in place of "
        "the example's, and write nothing after it:\n"
        f"{MARKUP.write([_example_call(tools[0])])}\n\n"
        "Rules:\n"
        "- Call a tool only when you need what it gives to answer. Otherwise answer directly, with no <tool_call>.\n"
        '- "name" is one of the tools above, exactly as written. "arguments" is a JSON object holding the '
        "arguments its schema lists, every required one included.\n"
        f"- {several}\n"
        "- The results come back in the next message, each inside <tool_response> tags. Never write a "
        "<tool_response> yourself.\n"
        "- Then answer the user with what the results say."
    )


def _example_call(tool: ToolSpec) -> ToolCall:
    """A call to `tool` with placeholder values for its required arguments (or its first one)."""
    properties, required = properties_of(tool)
    names = [name for name in properties if name in required] or list(properties)[:1]
    return ToolCall(tool.name, {name: _PLACEHOLDERS.get(schema_type(properties[name]), "...") for name in names})


def response_block(name: str, text: str) -> str:
    """One result, as the convention gives it back."""
    return f'<tool_response name="{name}">\n{text}\n</tool_response>'


def convention_turns(turns: list[dict], tools: Sequence[ToolSpec], parallel: bool = True) -> list[dict]:
    """`turns` (the chat API's, with tool calls and results: turns.py) as plain {"role", "content"} turns
    that carry the tools and calls in the convention's text."""
    out: list[dict] = []
    offer = instructions(tools, parallel) if tools else ""
    system = next((t for t in turns if t["role"] == "system"), None) if tools else None
    if offer and system is None:
        out.append({"role": "system", "content": offer})
    results_open = False  # the last turn out is a user turn of results, which the next result joins
    for turn in turns:
        role, content = turn["role"], turn.get("content") or ""
        if role == "tool":
            block = response_block(turn.get("name") or "tool", content)
            if results_open:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            results_open = True
            continue
        if role == "user" and results_open:  # a message sent before the model answered the results
            out[-1]["content"] += "\n\n" + content
            continue
        results_open = False
        if turn is system:
            content = f"{content.rstrip()}\n\n{offer}" if content.strip() else offer
        elif role == "assistant" and turn.get("tool_calls"):
            markup = MARKUP.write(turn_calls(turn))
            content = f"{content.rstrip()}\n\n{markup}" if content.strip() else markup
        out.append({"role": role, "content": content})
    return out
