"""The names the model calls MCP tools by: a tool's own name when it is unique, "server__tool" on a clash,
and the way back from either form; a server's tool with an unusable name or description."""

import mcp_types as types
import pytest

from app.tools.mcp.tool_names import UnknownTool, resolve, tool_specs, usable


def tool(name: str, description: str = "", schema: dict | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema or {"type": "object"})


def test_a_unique_tool_keeps_its_own_name_and_a_clash_is_qualified_by_server():
    specs = tool_specs({"git": [tool("status"), tool("git_log")], "jj": [tool("status")]})
    assert [(s.name, s.server) for s in specs] == [("git__status", "git"), ("git_log", "git"), ("jj__status", "jj")]


def test_names_are_decided_over_the_servers_listed_together():
    assert [s.name for s in tool_specs({"git": [tool("status")]})] == ["status"]


def test_either_form_resolves_back_to_the_servers_tool():
    known = {"git": {"status", "git_log"}, "jj": {"status"}}
    assert resolve("git_log", known) == ("git", "git_log")
    assert resolve("git__git_log", known) == ("git", "git_log")
    assert resolve("jj__status", known) == ("jj", "status")


def test_an_ambiguous_or_unknown_name_is_one_sentence():
    known = {"git": {"status"}, "jj": {"status"}}
    with pytest.raises(UnknownTool, match="call git__status or jj__status"):
        resolve("status", known)
    with pytest.raises(UnknownTool, match="no MCP server offers a tool named 'nope'"):
        resolve("nope", known)


def test_a_servers_description_and_schema_strings_are_cleaned():
    spec, = tool_specs({"s": [tool("t", "does \x1b[31mthings\x1b[0m\u202e", {
        "type": "object", "properties": {"q\x07": {"type": "string", "description": "a \x1b]0;x\x07query"}}})]})
    assert spec.description == "does things"
    assert spec.parameters["properties"] == {"q": {"type": "string", "description": "a query"}}


def test_a_tool_with_an_unusable_name_or_a_huge_schema_is_left_out():
    assert usable(tool("get-time.v2_x"))
    assert not usable(tool("evil\x1b[2J")) and not usable(tool("with space")) and not usable(tool("x" * 129))
    assert not usable(tool("big", schema={"type": "object", "description": "d" * 40_000}))
