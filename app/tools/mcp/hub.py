"""McpHub: the user's MCP servers behind a synchronous API, for the chat's engine thread and `kvchat ask`.

    hub = McpHub(config.mcp, count_tokens=lambda text: len(tokenizer.encode(text)))
    specs = hub.tools()                       # starts the servers (all at once) at the first listing
    result = hub.call(call, cancel=stop_event) # a ToolResult, always: failures are its text, in one sentence
    hub.status()                               # {"git": ServerStatus("ready", tools=12), ...}
    hub.close()                                # every server stopped, its process group ended

One background thread runs an asyncio event loop (anyio's, with a BlockingPortal the other threads submit
to); every server lives there as a ServerConnection, started lazily: by the first listing that covers it,
or by the first call to one of its tools. No method raises for a server's sake: a server that cannot start,
hangs, crashes, exits or answers garbage is a sentence in ToolResult.text (is_error) or in status(), and the
other servers carry on. A call ends by its timeout (the call's, else the server's `timeout`, else
DEFAULT_CALL_TIMEOUT_S) or, promptly, when `cancel` is set (Esc): then its text is "stopped" and the server
is told to stop working on it (MCP's notifications/cancelled).

Logs: each server's stderr and kvchat's notes about it go to <data dir>/logs/mcp/NAME.log; the SDK's own
warnings to sdk.log there (unhandled, Python's last-resort handler would print them over the chat).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path

import anyio
import mcp_types as types
from anyio.from_thread import BlockingPortal

from app.tools.mcp.connection import START_TIMEOUT_S, CallFailed, ServerConnection, ServerStatus
from app.tools.mcp.result_text import result_text
from app.tools.mcp.safe_text import one_line
from app.tools.mcp.settings import McpSettings
from app.tools.mcp.tool_names import SEPARATOR, UnknownTool, resolve, tool_specs, usable
from app.tools.spec import ToolCall, ToolResult, ToolSpec
from storage.data_dir import data_dir

DEFAULT_CALL_TIMEOUT_S = 60.0
CANCEL_POLL_S = 0.05  # how often a waiting call looks at its cancel event: "promptly" to a person
CLOSE_WAIT_S = 15.0  # every server stops within about 4 s (server_process.stop); this is the outer bound
STOPPED = "stopped"
CLOSED = "the MCP servers were closed"
SDK_LOGGERS = ("mcp", "client")
_sdk_logs_routed = False


class McpHub:
    def __init__(self, settings: McpSettings, *, count_tokens: Callable[[str], int] | None = None,
                 log_dir: Path | None = None, call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
                 start_timeout: float = START_TIMEOUT_S):
        """`count_tokens`: the model's token count, for a result's budget (settings.result_tokens); None
        counts characters (safe_text.CHARS_PER_TOKEN)."""
        self.settings, self.count_tokens, self.call_timeout = settings, count_tokens, call_timeout
        self.log_dir = log_dir or data_dir() / "logs" / "mcp"
        self._connections = {name: ServerConnection(name, spec, self.log_dir / f"{name}.log", start_timeout)
                             for name, spec in settings.servers.items()}
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._task_group: anyio.abc.TaskGroup | None = None  # the loop's task group the connections run in
        self._thread: threading.Thread | None = None
        self._closed = False

    def __enter__(self) -> McpHub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # The synchronous API.

    def tools(self, servers: list[str] | None = None, cancel: threading.Event | None = None) -> list[ToolSpec]:
        """The tools of `servers` (default: all; names not configured are left out), as the model is offered
        them (tool_names.py). Servers not started yet start now, together; one that fails is left out and
        status() says why."""
        names = [name for name in (self._connections if servers is None else servers) if name in self._connections]
        if not names:
            return []
        listing = self._wait(self._listing, names, cancel=cancel)
        return tool_specs(listing) if isinstance(listing, dict) else []

    def call(self, call: ToolCall, timeout: float | None = None, cancel: threading.Event | None = None,
             count_tokens: Callable[[str], int] | None = None) -> ToolResult:
        """Run the tool the model called. Never raises: a failure is the result's text (is_error)."""
        started = time.perf_counter()
        outcome = self._wait(self._call, call, timeout, cancel=cancel)
        ms = (time.perf_counter() - started) * 1000
        if isinstance(outcome, str):
            return ToolResult(call, outcome, is_error=True, ms=ms)
        try:
            text, cut = result_text(outcome, self.settings.result_tokens, count_tokens or self.count_tokens)
        except Exception as exc:  # a tokenizer that fails on odd text, say: still the call's answer
            return ToolResult(call, f"the result of {call.name!r} could not be read ({type(exc).__name__})",
                              is_error=True, ms=ms)
        return ToolResult(call, text, is_error=outcome.is_error, ms=ms, truncated=cut)

    def status(self) -> dict[str, ServerStatus]:
        """Each configured server's state, in the config's order; starts nothing."""
        return {name: connection.status() for name, connection in self._connections.items()}

    def resolve(self, name: str) -> tuple[str, str] | None:
        """(server, tool) for a name the model may call, among the tools already listed; starts nothing."""
        try:
            return resolve(name, self._known())
        except UnknownTool:
            return None

    def runs_without_asking(self, call: ToolCall) -> bool:
        """Whether the user's allow-list ([mcp] allow) lets the call run without asking."""
        found = self.resolve(call.name)
        return found is not None and self.settings.allows(*found)

    def close(self) -> None:
        """Stop every server (concurrently; bounded) and the loop's thread. Later calls answer CLOSED."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            portal = self._portal
        if portal is not None:
            for step in (lambda: portal.call(self._stop_all), lambda: portal.call(portal.stop, True)):
                try:
                    step()
                except Exception:  # a loop already gone: nothing left to stop there
                    pass
            self._thread.join(CLOSE_WAIT_S)
        for connection in self._connections.values():
            connection.state, connection.problem = "closed", ""

    # The loop's side.

    async def _listing(self, names: list[str]) -> dict[str, list[types.Tool]]:
        found: dict[str, list[types.Tool]] = {}

        async def list_one(name: str) -> None:
            connection = self._connections[name]
            try:
                tools = await connection.list_tools(self._task_group, self.call_timeout)
            except CallFailed:
                return
            found[name] = [tool for tool in tools if usable(tool)]
            if len(found[name]) < len(tools):
                skipped = ", ".join(one_line(t.name, 60) for t in tools if not usable(t))
                connection.note(f"tools left out (a name outside [A-Za-z0-9_.-] or a schema too large): {skipped}")

        async with anyio.create_task_group() as listings:
            for name in names:
                listings.start_soon(list_one, name)
        return {name: found[name] for name in names if name in found}

    async def _call(self, call: ToolCall, timeout: float | None) -> types.CallToolResult | str:
        try:
            server, tool = await self._resolve_starting(call.name)
            connection = self._connections[server]
            limit = timeout or connection.spec.timeout or self.call_timeout
            return await connection.call_tool(self._task_group, tool, _sendable(call.arguments), limit)
        except (CallFailed, UnknownTool) as exc:
            return str(exc)
        except Exception as exc:  # nothing a server does may reach the caller as an exception
            return f"the call to {one_line(call.name, 100)!r} failed ({type(exc).__name__}: {one_line(str(exc))})"

    async def _resolve_starting(self, name: str) -> tuple[str, str]:
        """resolve(), starting the servers that could offer `name` when no listed one does."""
        try:
            return resolve(name, self._known())
        except UnknownTool:
            server = self._connections.get(name.partition(SEPARATOR)[0])
            unlisted = [n for n, c in self._connections.items() if c.state == "not started"]
            await self._listing([server.name] if server and server.name in unlisted else unlisted)
            try:
                return resolve(name, self._known())
            except UnknownTool:
                if server is not None and server.problem:  # "git__status" while git is down: say why
                    raise CallFailed(server.problem) from None
                raise

    def _known(self) -> dict[str, set[str]]:
        return {name: {tool.name for tool in connection.tools if usable(tool)}
                for name, connection in self._connections.items()}

    async def _stop_all(self) -> None:
        async with anyio.create_task_group() as stops:
            for connection in self._connections.values():
                stops.start_soon(connection.stop)

    # The thread.

    def _wait(self, function, *args, cancel: threading.Event | None):
        """`function(*args)` run on the loop; its value, STOPPED when `cancel` was set first, CLOSED after
        close()."""
        portal = self._loop()
        if portal is None:
            return CLOSED
        try:
            future: Future = portal.start_task_soon(function, *args)
        except RuntimeError:  # the portal stopped in between
            return CLOSED
        while True:
            try:
                return future.result(timeout=CANCEL_POLL_S if cancel is not None else None)
            except TimeoutError:
                if cancel.is_set():
                    future.cancel()  # the task is cancelled in the loop; the SDK tells the server
                    return STOPPED
            except CancelledError:
                return CLOSED if self._closed else STOPPED

    def _loop(self) -> BlockingPortal | None:
        with self._lock:
            if self._closed:
                return None
            if self._portal is None:
                _route_sdk_logs(self.log_dir / "sdk.log")
                started = threading.Event()
                self._thread = threading.Thread(target=anyio.run, args=(self._serve, started), daemon=True,
                                                name="kvchat MCP servers")
                self._thread.start()
                started.wait()
            return self._portal

    async def _serve(self, started: threading.Event) -> None:
        try:
            async with BlockingPortal() as portal, anyio.create_task_group() as servers:
                self._portal, self._task_group = portal, servers
                started.set()
                await portal.sleep_until_stopped()
                servers.cancel_scope.cancel()
        finally:
            started.set()  # never leave _loop waiting, even if the loop failed to start


def _sendable(arguments: dict) -> dict:
    """The arguments as JSON can carry them: a lone surrogate the model wrote ("\\ud800") becomes "?"."""
    text = json.dumps(arguments, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8")
    return json.loads(text)


def _route_sdk_logs(path: Path) -> None:
    """The SDK's loggers to a file, once per process, instead of stderr: "mcp.*", and "client", the name its
    ClientSession logs under (warnings a server can cause at will, with tracebacks: a malformed notification)."""
    global _sdk_logs_routed
    if _sdk_logs_routed:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in SDK_LOGGERS:
        sdk = logging.getLogger(name)
        sdk.addHandler(handler)
        sdk.setLevel(logging.WARNING)
        sdk.propagate = False
    _sdk_logs_routed = True
