"""The names the model knows MCP tools by, and the way back from a name to a server's tool.

A tool is offered under its own name when no other server offers one of that name (what servers' docs and
users call it, and the shortest prompt); when two or more of the servers offered together have it, each is
offered as "server__tool" ("git__status", "jj__status"). Names are decided per listing, over the servers
that listing covers. Going back accepts both forms whatever a listing said: a tool's own name when exactly
one started server has it, and "server__tool" always (server names contain no "__": server_entry.py).

A tool's name, description and schema come from the server: a name outside MCP's [A-Za-z0-9_.-]{1,128}
leaves the tool out (it could carry anything into the prompt); descriptions and every string of the schema
are cleaned (safe_text.py) and bounded.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import mcp_types as types

from app.tools.mcp.safe_text import clean
from app.tools.spec import ToolSpec

SEPARATOR = "__"
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_DESCRIPTION_CHARS = 2000
MAX_SCHEMA_CHARS = 32_000  # a schema longer than this is a server describing itself into the context


class UnknownTool(LookupError):
    """No tool answers to the name; the message is one sentence."""


def usable(tool: types.Tool) -> bool:
    return TOOL_NAME.fullmatch(tool.name) is not None and len(json.dumps(tool.input_schema)) <= MAX_SCHEMA_CHARS


def tool_specs(listing: dict[str, list[types.Tool]]) -> list[ToolSpec]:
    """The tools of the servers in `listing` (server -> its usable tools), as the model is offered them."""
    counts = Counter(tool.name for tools in listing.values() for tool in tools)
    specs = []
    for server, tools in listing.items():
        for tool in tools:
            name = tool.name if counts[tool.name] == 1 else f"{server}{SEPARATOR}{tool.name}"
            description = clean(tool.description or tool.title or "")[:MAX_DESCRIPTION_CHARS]
            specs.append(ToolSpec(name, description, _cleaned(tool.input_schema), server))
    return specs


def resolve(name: str, known: dict[str, set[str]]) -> tuple[str, str]:
    """(server, tool) for the name the model called, over `known` (server -> its tools' names). Raises
    UnknownTool."""
    holders = [server for server, tools in known.items() if name in tools]
    if len(holders) == 1:
        return holders[0], name
    server, separator, tool = name.partition(SEPARATOR)
    if separator and tool in known.get(server, ()):
        return server, tool
    if holders:
        choices = " or ".join(f"{server}{SEPARATOR}{name}" for server in holders)
        raise UnknownTool(f"the tool name {name!r} is offered by {len(holders)} MCP servers; call {choices}")
    raise UnknownTool(f"no MCP server offers a tool named {clean(name)[:100]!r}")


def _cleaned(value):
    """A JSON value with every string in it (keys too) cleaned."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(str(key)): _cleaned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    return value
