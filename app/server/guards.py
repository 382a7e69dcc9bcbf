"""The API's guards around every request: the API key, the body's size, and a client that goes away.

ASGI middleware (BearerAuth, BodyLimit) run before FastAPI parses anything, so a
wrong key or an oversized body costs the server nothing; unless_disconnected lets a
non-streaming endpoint notice its client leaving while the reply is computed.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from typing import TypeVar

from fastapi.responses import JSONResponse

from app.server.schema import error_body


class BearerAuth:
    """ASGI middleware: every request needs `Authorization: Bearer KEY`, else 401 (before anything else)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = JSONResponse(error_body("Missing or wrong API key: send 'Authorization: Bearer KEY'.",
                                                   code="invalid_api_key"), status_code=401)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is a 413, refused by its Content-Length before
    any of it is read, or as soon as a chunked body outgrows the limit. A body within it is read here
    (the app reads it whole anyway) and handed on; later receive() calls go to the server (disconnects)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and int(declared) > self.limit:
            return await self.refuse(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nobody to answer
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self.refuse(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def refuse(self, scope, receive, send):
        # Connection: close, since the rest of the body is never read.
        response = JSONResponse(error_body(f"The request body is larger than this server's limit of "
                                           f"{self.limit:,} bytes.", code="request_too_large"),
                                status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)


T = TypeVar("T")


async def unless_disconnected(work: Awaitable[T], receive) -> T | None:
    """`work`'s result, or None if the client disconnects first (`receive` then says http.disconnect),
    in which case `work` is cancelled and awaited (a reply's generation ends before its next step)."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result() if not task.cancelled() else None


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # the request's body was read before the endpoint ran: only the disconnect is left
