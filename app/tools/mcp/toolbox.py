"""McpToolBox: some of the hub's servers as a ToolBox (app/tools/toolbox.py), what the tool loop runs calls
with. The servers start at the first listing (McpHub starts them together); the listing is then kept for the
box's life, so each round offers the model the same tools (and the prompt's tool block stays cached)."""

from __future__ import annotations

import threading

from app.tools.mcp.hub import McpHub
from app.tools.spec import ToolCall, ToolResult, ToolSpec


class McpToolBox:
    def __init__(self, hub: McpHub, servers: list[str] | None = None, background: bool = False):
        """`servers`: the configured servers whose tools are offered (None: all of them). `background`: the
        servers start on a thread of their own (start()), and specs() offers nothing until they have listed
        their tools, rather than make its caller (the chat's UI thread) wait for them."""
        self.hub = hub
        self.servers = servers
        self.background = background
        self._specs: list[ToolSpec] | None = None
        self._listing = threading.Lock()

    def start(self) -> None:
        """Start the servers and list their tools now, on a thread of their own (the chat starts them with
        the app, so tools are there by the first message)."""
        threading.Thread(target=self._list, name="kvchat-mcp-start", daemon=True).start()

    def _list(self) -> list[ToolSpec]:
        with self._listing:
            if self._specs is None:
                self._specs = self.hub.tools(self.servers)
            return self._specs

    def specs(self) -> list[ToolSpec]:
        if self._specs is not None:
            return self._specs
        return [] if self.background else self._list()

    def problems(self) -> list[str]:
        """One sentence per server of the box that could not be started (its tools are missing)."""
        wanted = self.servers if self.servers is not None else list(self.hub.status())
        return [f"the MCP server {name!r}: {status.problem}" for name, status in self.hub.status().items()
                if name in wanted and status.state == "failed" and status.problem]

    def run(self, call: ToolCall, cancel: threading.Event | None = None) -> ToolResult:
        return self.hub.call(call, cancel=cancel)
