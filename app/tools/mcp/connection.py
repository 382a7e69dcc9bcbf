"""One MCP server's life in the hub's event loop: started when first needed, ready with its tools, and
failed or exited with one sentence saying why. Everything that goes wrong with a server ends as a
CallFailed sentence here; nothing else leaves this module, so one server's trouble stays its own.

A server that cannot start (no such command, exits, does not answer within the start timeout) is failed
for the hub's life: starting it again would cost every message the same wait. One that stops after it
was ready (a crash mid-call, an exit) is started again at its next use, up to MAX_RESTARTS times.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from app.tools.mcp.http_transport import http_link
from app.tools.mcp.link import Link, NotJsonRpc
from app.tools.mcp.safe_text import one_line
from app.tools.mcp.server_entry import ServerSpec, StdioServer
from app.tools.mcp.server_process import ServerStartError
from app.tools.mcp.stdio_transport import MAX_MESSAGE_BYTES, TOO_LARGE, stdio_link

START_TIMEOUT_S = 30.0  # a server's start (the initialize handshake and its tool list)
MAX_RESTARTS = 3
MAX_TOOL_PAGES = 20  # tools/list pages; a server that pages on without end is cut here
END_WAIT_S = 5.0  # a call whose server went away waits this long to learn how it went (its exit code)
CLIENT_INFO = types.Implementation(name="kvchat", version="0.1.0")


class CallFailed(Exception):
    """A server or call that did not work; the message is the sentence for the model and the user."""


@dataclass(frozen=True)
class ServerStatus:
    state: str  # "not started", "starting", "ready", "failed", "exited" (may start again), "closed"
    problem: str = ""  # one sentence when failed or exited (the text a call to its tools gets)
    tools: int = 0
    log: Path | None = None  # the server's stderr (stdio) and kvchat's notes about it

    def __str__(self) -> str:
        """For people: the state, what went wrong and where to read more."""
        return f"{self.state}: {self.problem} (its log: {self.log})" if self.problem else self.state


class ServerConnection:
    def __init__(self, name: str, spec: ServerSpec, log_path: Path, start_timeout: float = START_TIMEOUT_S):
        self.name, self.spec, self.log_path, self.start_timeout = name, spec, log_path, start_timeout
        self.state, self.problem = "not started", ""
        self.tools: list[types.Tool] = []
        self.bad_lines = 0  # lines the server wrote that were not JSON-RPC
        self._session: ClientSession | None = None
        self._starts = 0
        self._tools_stale = False
        # The current run's: its events (anyio's, made in the loop), its cancel scope, its link.
        self._started = self._stop = self._finished = None
        self._scope: anyio.CancelScope | None = None
        self._link: Link | None = None
        self._end_note = "the connection closed"

    def status(self) -> ServerStatus:
        return ServerStatus(self.state, self.problem, len(self.tools) if self.state == "ready" else 0, self.log_path)

    async def ready(self, task_group: TaskGroup) -> None:
        """Start the server if it is not running and wait for its start. Raises CallFailed."""
        if self.state in ("not started", "exited") and self._starts <= MAX_RESTARTS:
            self._start(task_group)
        if self.state == "starting":
            await self._started.wait()
        if self.state == "exited":
            raise CallFailed(f"{self.problem}; it stopped {self._starts} times and is not started again")
        if self.state != "ready":
            raise CallFailed(self.problem or f"the MCP server {self.name!r} is {self.state}")

    async def list_tools(self, task_group: TaskGroup, timeout: float) -> list[types.Tool]:
        """The server's tools (listed again after it said they changed). Raises CallFailed."""
        await self.ready(task_group)
        if self._tools_stale:
            self._tools_stale = False
            with anyio.move_on_after(timeout):
                try:
                    self.tools = await _all_tools(self._session)
                except Exception as exc:
                    self.note(f"listing the tools again failed ({type(exc).__name__}: {exc})")
        return self.tools

    async def call_tool(self, task_group: TaskGroup, tool: str, arguments: dict,
                        timeout: float) -> types.CallToolResult:
        """The tool's result, within `timeout` seconds of the server being ready. Raises CallFailed."""
        await self.ready(task_group)
        session, link, bad_lines = self._session, self._link, self.bad_lines
        what = f"the tool {tool!r} of the MCP server {self.name!r}"
        try:
            with anyio.move_on_after(timeout):
                return await session.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == TOO_LARGE:
                raise CallFailed(f"{what} answered with more than {MAX_MESSAGE_BYTES >> 20} MiB, "
                                 "more than kvchat reads") from None
            if link.ended.is_set() or (exc.code == types.CONNECTION_CLOSED and exc.message == "Connection closed"):
                with anyio.move_on_after(END_WAIT_S):
                    await self._finished.wait()  # the exit code is known once the transport has stopped
                raise CallFailed(f"the MCP server {self.name!r} stopped during the call to {tool!r} "
                                 f"({self._end_note})") from None
            raise CallFailed(f"{what} refused the call: {one_line(exc.message)}") from None
        except ValidationError:
            raise CallFailed(f"{what} answered with something that is not a tool result") from None
        except RuntimeError as exc:  # the SDK's checks of a result: against the tool's output schema, say
            raise CallFailed(f"{what} returned a result kvchat cannot use ({one_line(str(exc))})") from None
        except Exception as exc:  # anything unforeseen stays this call's
            raise CallFailed(f"{what} failed: {one_line(str(exc)) or type(exc).__name__}") from None
        garbled = " (it wrote lines that are not JSON-RPC meanwhile; see its log)" if self.bad_lines > bad_lines else ""
        raise CallFailed(f"{what} did not answer within {timeout:g} s{garbled}")

    async def stop(self) -> None:
        """Stop the server (bounded: the transport's stop is) and mark the connection closed."""
        if self._stop is not None and not self._finished.is_set():
            self._stop.set()
            if self.state == "starting":
                self._scope.cancel()  # a server hanging in its start would otherwise keep the close waiting
            with anyio.move_on_after(END_WAIT_S * 2):
                await self._finished.wait()
        self.state, self.problem = "closed", ""

    def _start(self, task_group: TaskGroup) -> None:
        self._starts += 1
        self.state, self.problem = "starting", ""
        self._started, self._stop, self._finished = anyio.Event(), anyio.Event(), anyio.Event()
        self._scope, self._link = anyio.CancelScope(), None
        task_group.start_soon(self._run, name=f"MCP server {self.name}")

    async def _run(self) -> None:
        link, failure, was_ready = None, None, False
        try:
            with self._scope:
                async with AsyncExitStack() as stack:
                    link = self._link = await stack.enter_async_context(self._open_link())
                    session = await stack.enter_async_context(
                        ClientSession(link.read, link.write, message_handler=self._on_message, client_info=CLIENT_INFO))
                    with anyio.move_on_after(self.start_timeout) as deadline:
                        await session.initialize()
                        self.tools = await _all_tools(session)
                    if deadline.cancelled_caught:
                        raise CallFailed(f"the MCP server {self.name!r} did not answer within "
                                         f"{self.start_timeout:g} s of starting")
                    self._session, self.state, was_ready = session, "ready", True
                    self._started.set()
                    await _first(self._stop, link.ended)
        except Exception as exc:
            failure = exc
        finally:
            self._session = None
            self._end_note = link.end_note() if link is not None else self._end_note
            if self._stop.is_set():
                self.state, self.problem = "closed", ""
            elif was_ready:
                self.state = "exited"
                self.problem = f"the MCP server {self.name!r} stopped ({self._end_note})"
            else:
                self.state, self.problem = "failed", self._start_failure(failure)
            self.note(self.problem or f"stopped ({self._end_note})")
            self._started.set()
            self._finished.set()

    def _open_link(self):
        if isinstance(self.spec, StdioServer):
            return stdio_link(self.name, self.spec, self.log_path)
        return http_link(self.spec)

    def _start_failure(self, failure: BaseException | None) -> str:
        cause = _root_cause(failure)
        if isinstance(cause, CallFailed | ServerStartError):
            return str(cause)
        if isinstance(self.spec, StdioServer):
            return f"the MCP server {self.name!r} exited while starting ({self._end_note})"
        detail = one_line(str(cause)) or type(cause).__name__
        return f"the MCP server {self.name!r} at {one_line(self.spec.url, 120)} could not be reached ({detail})"

    async def _on_message(self, message) -> None:
        if isinstance(message, Exception):
            self.bad_lines += 1
            self.note(f"the server sent {message}" if isinstance(message, NotJsonRpc) else f"transport: {message!r}")
        elif getattr(message, "method", None) == "notifications/tools/list_changed":
            self._tools_stale = True

    def note(self, text: str) -> None:
        """A line of kvchat's in the server's log (beside its stderr)."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8", errors="replace") as log:
                log.write(f"[kvchat {time.strftime('%Y-%m-%d %H:%M:%S')}] {one_line(text, 2000)}\n")
        except OSError:
            pass  # a log that cannot be written is no reason to fail a call


async def _all_tools(session: ClientSession) -> list[types.Tool]:
    tools, cursor = [], None
    for _ in range(MAX_TOOL_PAGES):
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += page.tools
        if not (cursor := page.next_cursor):
            break
    return tools


async def _first(*events: anyio.Event) -> None:
    """Wait until one of `events` is set."""
    async with anyio.create_task_group() as waiters:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            waiters.cancel_scope.cancel()

        for event in events:
            waiters.start_soon(wait, event)


def _root_cause(exc: BaseException | None) -> BaseException | None:
    """The first real error inside exception groups (a transport's task group wraps what failed)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = next((e for e in exc.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())), exc.exceptions[0])
    return exc
