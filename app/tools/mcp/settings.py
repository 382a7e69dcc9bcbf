"""The MCP part of config.toml: the servers, which of their tools run without asking, and how far a reply
may go with tools.

    mcp_config = "~/.config/Claude/claude_desktop_config.json"   # another app's {"mcpServers": {...}} file

    [mcp]
    allow = ["time.*", "git.git_status"]   # globs on "server.tool": these run without asking
    max_rounds = 8                         # tool rounds in one reply before the model must answer
    result_tokens = 2000                   # a tool result's share of the context, in the model's tokens

    [mcp.servers.git]                      # a server kvchat starts (stdio)
    command = "mcp-server-git"             # found on PATH; a path with a / is read from cwd
    args = ["--repository", "~/src/kvchat"]
    env = { GIT_PAGER = "cat" }            # added to the few variables every server gets
    cwd = "~/src"                          # optional; relative to this file's folder
    timeout = 60                           # seconds a call may take (optional)

    [mcp.servers.search]                   # a server kvchat connects to (streamable HTTP)
    url = "http://127.0.0.1:8931/mcp"
    headers = { Authorization = "Bearer ..." }

Servers from mcp_config and from [mcp.servers] are merged; a name in both is config.toml's (so
`[mcp.servers.NAME] disabled = true` turns off another app's server for kvchat only).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from app.tools.mcp.server_entry import DISABLED, McpConfigError, ServerSpec, server_entry

DEFAULT_MAX_ROUNDS = 8  # a model that needs more tool rounds than this for one reply is looping
DEFAULT_RESULT_TOKENS = 2000  # a page of text: room for a result without crowding out the conversation
MAX_ROUNDS_LIMIT = 100
MIN_RESULT_TOKENS = 50  # below this even a one-line error is cut
MCP_KEYS = ("allow", "max_rounds", "result_tokens", "servers")


@dataclass(frozen=True)
class McpSettings:
    servers: dict[str, ServerSpec] = field(default_factory=dict, hash=False)  # in the order the files list them
    allow: tuple[str, ...] = ()  # globs on "server.tool" (fnmatch, case-sensitive)
    max_rounds: int = DEFAULT_MAX_ROUNDS
    result_tokens: int = DEFAULT_RESULT_TOKENS

    def allows(self, server: str, tool: str) -> bool:
        """Whether the tool runs without asking the user first."""
        return any(fnmatch.fnmatchcase(f"{server}.{tool}", pattern) for pattern in self.allow)


def mcp_settings(table: object, path: Path, shared_servers: dict[str, ServerSpec | None] | None = None) -> McpSettings:
    """config.toml's [mcp] table (`table`; {} when there is none) over the servers of the shared JSON file
    (`shared_servers`, from mcp_json.py; None marks one that file disables). Raises McpConfigError."""
    def fail(key: str, rule: str):
        raise McpConfigError(f"in the config file {path}, {key} {rule}")

    if not isinstance(table, dict):
        fail("[mcp]", "must be a table")
    for key in table:
        if key not in MCP_KEYS:
            fail(f"mcp.{key}", f"is not an MCP setting (known: {', '.join(MCP_KEYS)})")
    allow = table.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(p, str) and p.strip() for p in allow):
        fail("mcp.allow", 'must be a list of "server.tool" patterns (like "time.*")')
    max_rounds = table.get("max_rounds", DEFAULT_MAX_ROUNDS)
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or not 1 <= max_rounds <= MAX_ROUNDS_LIMIT:
        fail("mcp.max_rounds", f"must be a whole number from 1 to {MAX_ROUNDS_LIMIT}")
    result_tokens = table.get("result_tokens", DEFAULT_RESULT_TOKENS)
    if isinstance(result_tokens, bool) or not isinstance(result_tokens, int) or result_tokens < MIN_RESULT_TOKENS:
        fail("mcp.result_tokens", f"must be a whole number of tokens, {MIN_RESULT_TOKENS} or more")
    own = table.get("servers", {})
    if not isinstance(own, dict):
        fail("[mcp.servers]", "must be a table of servers ([mcp.servers.NAME])")
    servers = dict(shared_servers or {})
    for name, raw in own.items():
        servers[name] = server_entry(name, raw, f"mcp.servers.{name}", path, strict=True)
    enabled = {name: spec for name, spec in servers.items() if spec is not DISABLED}
    return McpSettings(enabled, tuple(allow), max_rounds, result_tokens)
