"""The MCP server list other apps keep (Claude Desktop's claude_desktop_config.json, Cursor's and LM
Studio's mcp.json), named by config.toml's `mcp_config`, so servers set up once serve kvchat too:

    {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                    "docs": {"url": "https://example.org/mcp", "headers": {"Authorization": "..."}}}}

Keys kvchat does not use (autoApprove, alwaysAllow, other apps' timeouts) are left alone: the file is
shared. `"disabled": true` is honoured; `"type": "sse"` (the old HTTP transport) is refused by name.
config.py reads the file (with the same guards as config.toml) and hands the text here."""

from __future__ import annotations

import json
from pathlib import Path

from app.tools.mcp.server_entry import McpConfigError, ServerSpec, server_entry


def mcp_json_servers(text: str, path: Path) -> dict[str, ServerSpec | None]:
    """Server name -> server (None: disabled there), in the file's order. Raises McpConfigError."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"the MCP config file {path} is not valid JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers", {}), dict):
        raise McpConfigError(f'in the MCP config file {path}, mcpServers must be an object of servers '
                             '({"name": {"command": ...}})')
    return {name: server_entry(name, raw, f"mcpServers.{name}", path, strict=False)
            for name, raw in document.get("mcpServers", {}).items()}
