"""The API's guards around every request: the Host header, the API key, the body's size, and a client that
goes away.

ASGI middleware (HostCheck, BearerAuth, BodyLimit) run before FastAPI parses anything, so a
foreign Host, a wrong key or an oversized body costs the server nothing; unless_disconnected lets a
non-streaming endpoint notice its client leaving while the reply is computed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
from collections.abc import Awaitable
from typing import TypeVar

from fastapi.responses import JSONResponse

from app.server.schema import error_body


def allowed_host_names(host: str, bound: str, allowed: list[str]) -> frozenset[str] | None:
    """The Host names a server on `host` (as given; `bound`: the address its socket has) answers to, or
    None for any. A page on another site can reach a server on this machine by resolving its own name
    to 127.0.0.1 (DNS rebinding), but its requests still carry that name: so a server bound to loopback
    answers only to its address, `localhost` and `allowed`. One bound elsewhere is reached by names this
    machine cannot know: only `allowed` (when given) and `host` itself are checked there."""
    loopback = ipaddress.ip_address(bound.split("%")[0]).is_loopback
    if not loopback and not allowed:
        return None
    names = {host_name(name) for name in (host, *allowed)}
    if loopback:
        names |= {host_name(bound), "localhost"}
    return frozenset(names)


def host_name(value: str) -> str:
    """A Host header's name without its port, in lower case; an IPv6 address in brackets, as Host carries it.
    (The port is not checked: an SSH tunnel or a proxy may forward another port to the server's.)"""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] or value
    if value.count(":") > 1:  # a bare IPv6 address (--host ::1)
        return f"[{value}]"
    name, _, port = value.rpartition(":")
    return (name if name and port.isdigit() else value).rstrip(".")  # "localhost." is localhost


class HostCheck:
    """ASGI middleware: a request whose Host header names none of `names` is a 403 (before anything else).
    A request without one passes: a browser always sends one, so no web page can make such a request."""

    def __init__(self, app, names: frozenset[str]):
        self.app, self.names = app, names

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            hosts = [value.decode("latin-1") for key, value in scope["headers"] if key == b"host"]
            if len(hosts) > 1 or (hosts and host_name(hosts[0]) not in self.names):
                name = host_name(hosts[0])
                response = JSONResponse(error_body(
                    f"This server does not answer to the Host '{name}'; start it with --allowed-host {name} "
                    f"to allow it." if len(hosts) == 1 else "Send one Host header, not several.",
                    code="host_not_allowed"), status_code=403)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BearerAuth:
    """ASGI middleware: every request needs `Authorization: Bearer KEY`, else 401 (before anything else); two
    Authorization headers are a 400 (whichever one a proxy or server reads, the other would be ignored)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = [value for key, value in scope["headers"] if key == b"authorization"]
            if len(given) > 1:
                response = JSONResponse(error_body(f"Send one Authorization header, not {len(given)}.",
                                                   code="invalid_api_key"), status_code=400)
                return await response(scope, receive, send)
            if not secrets.compare_digest(given[0] if given else b"", self.expected):
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
