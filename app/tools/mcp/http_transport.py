"""MCP's streamable HTTP transport, the SDK's, with the server's headers (an API key, usually) on every
request. The SDK caps one server-sent event (its max_sse_event_size); a plain JSON answer is read whole,
which is why the stdio transport's byte cap has no twin here: a URL is a server the user chose to reach,
not a program kvchat runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from mcp.client.streamable_http import streamable_http_client

from app.tools.mcp.link import Link
from app.tools.mcp.server_entry import HttpServer

CONNECT_TIMEOUT_S = 30.0
# A server may hold an event stream open between answers; a call's own timeout (the hub's) ends a wait first.
READ_TIMEOUT_S = 300.0


@asynccontextmanager
async def http_link(spec: HttpServer) -> AsyncIterator[Link]:
    timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)
    async with (httpx2.AsyncClient(headers=spec.headers, timeout=timeout) as client,
                streamable_http_client(spec.url, http_client=client) as (read, write)):
        yield Link(read, write)
