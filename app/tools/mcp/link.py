"""A connection to one MCP server, as a transport hands it to the session: the SDK's pair of message
streams plus what the transport alone knows, that the server is gone and how it went."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio


@dataclass
class Link:
    read: Any  # the SDK's ReadStream[SessionMessage | Exception], as its transports yield
    write: Any  # the SDK's WriteStream[SessionMessage]
    # Set once the server is gone on its own (a stdio server's stdout closed); an HTTP link never sets it.
    ended: anyio.Event = field(default_factory=anyio.Event)
    end_note: Callable[[], str] = lambda: "the connection closed"  # how it went: "exit code 1", ...


class NotJsonRpc(ValueError):
    """A line from the server that is not a JSON-RPC message (the session is told, and carries on)."""
