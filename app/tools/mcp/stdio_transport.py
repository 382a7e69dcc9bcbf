"""MCP's stdio transport (newline-delimited JSON-RPC over a child's stdin and stdout), kvchat's own over the
SDK's framing and message types. The SDK's `stdio_client` spawns the server itself (no way to add the
death signal server_process.py needs), keeps a line in memory however long it grows (a server writing a
gigabyte without a newline takes the memory with it), decodes strictly (one invalid UTF-8 byte ends the
connection) and parses with pydantic's JSON parser, which refuses escaped lone surrogates ("\\ud800") that
Python servers send: the call that line answered would then wait for its timeout. Here:

- a message is at most `max_message_bytes`; a longer one is dropped as it streams (never held whole), and
  the request it answered gets an error at once (its id is read from the message's first or last bytes);
- bytes that are not UTF-8 become U+FFFD; a line pydantic's parser refuses is parsed again by Python's
  json (lone surrogates pass, to be replaced in safe_text.py);
- a line that is not JSON-RPC at all reaches the session as a NotJsonRpc exception, which is logged; the
  connection carries on (servers that print a banner to stdout still work).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.shared.message import SessionMessage

from app.tools.mcp.link import Link, NotJsonRpc
from app.tools.mcp.safe_text import one_line
from app.tools.mcp.server_entry import StdioServer
from app.tools.mcp.server_process import exit_note, spawn, stop

MAX_MESSAGE_BYTES = 16 << 20  # a result that size is already 4,000 times a result's token budget
EDGE_BYTES = 200  # how much of an over-long message is kept to find the id of the request it answers
TOO_LARGE = -32050  # the JSON-RPC error code kvchat gives a request whose answer was over the cap
# A response's id where servers write it: first after "jsonrpc" (Python's SDK), or last (TypeScript's SDK
# writes {"result": ..., "jsonrpc": "2.0", "id": 3}).
ID_AT_START = re.compile(
    rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(-?\d+|"[^"\\]{0,80}")\s*,\s*"(?:result|error)"')
ID_AT_END = re.compile(rb'"id"\s*:\s*(-?\d+|"[^"\\]{0,80}")\s*\}\s*$')


@dataclass(frozen=True)
class Oversized:
    """A line longer than the cap: its first and last EDGE_BYTES."""

    head: bytes
    tail: bytes


class LineFramer:
    """Splits the server's stdout into lines as chunks arrive, holding at most `max_bytes` of one line."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._line = bytearray()
        self._head: bytes | None = None  # set while an over-long line streams past
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        lines: list[bytes | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self._head is None:
                self._line += piece
                if len(self._line) > self.max_bytes:
                    self._head, self._tail = bytes(self._line[:EDGE_BYTES]), bytes(self._line[-EDGE_BYTES:])
                    self._line.clear()
            else:
                self._tail = (self._tail + piece)[-EDGE_BYTES:]
            if end < 0:
                return lines
            lines.append(Oversized(self._head, self._tail) if self._head is not None else bytes(self._line))
            self._head, self._tail = None, b""
            self._line.clear()
            start = end + 1


def parse_message(line: bytes) -> SessionMessage | Exception | None:
    """The JSON-RPC message on `line` (None for a blank line; NotJsonRpc for anything else)."""
    text = line.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError:
        pass
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(json.loads(text), by_name=False))
    except ValueError:
        return NotJsonRpc(f"a line that is not JSON-RPC: {one_line(text, 120)}")


def refuse_oversized(line: Oversized, max_bytes: int) -> SessionMessage | Exception:
    """An error answer to the request an over-long message answered, or NotJsonRpc when its id is not
    where servers put it."""
    found = ID_AT_START.match(line.head) or ID_AT_END.search(line.tail)
    size = f"{max_bytes / (1 << 20):g} MiB"
    if found is None:
        return NotJsonRpc(f"a message over {size}, not read: {one_line(line.head.decode('utf-8', 'replace'), 80)}")
    error = types.ErrorData(code=TOO_LARGE, message=f"the answer was over {size}, more than kvchat reads")
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=json.loads(found.group(1)), error=error))


@asynccontextmanager
async def stdio_link(name: str, spec: StdioServer, log_path: Path,
                     max_message_bytes: int = MAX_MESSAGE_BYTES) -> AsyncIterator[Link]:
    """The server started, as a Link; on exit the server is stopped (server_process.stop), even when the
    exit is a cancellation. Raises ServerStartError when it cannot be started."""
    process = await spawn(name, spec, log_path)
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    link = Link(read, write, end_note=lambda: exit_note(process.returncode))
    try:
        async with anyio.create_task_group() as pipes:
            pipes.start_soon(_read_messages, process, to_session, link.ended, max_message_bytes)
            pipes.start_soon(_write_messages, process, from_session, to_session)
            try:
                yield link
            finally:
                await stop(process)  # shielded inside
                pipes.cancel_scope.cancel()
    finally:
        for stream in (to_session, read, write, from_session):
            stream.close()


async def _read_messages(process: Process, to_session, ended: anyio.Event, max_bytes: int) -> None:
    framer = LineFramer(max_bytes)
    try:
        async for chunk in process.stdout:
            for line in framer.feed(chunk):
                message = refuse_oversized(line, max_bytes) if isinstance(line, Oversized) else parse_message(line)
                if message is not None:
                    await to_session.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass  # the session or the pipe is gone: the end is the same
    finally:
        ended.set()
        to_session.close()  # the session sees the end; its waiting requests fail as "connection closed"


async def _write_messages(process: Process, from_session, to_session) -> None:
    try:
        async for message in from_session:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            await process.stdin.send(data.encode() + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        to_session.close()  # the server stopped reading: end the session rather than leave requests waiting
