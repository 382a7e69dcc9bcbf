"""One MCP server as the user's config describes it: a command kvchat starts (stdio) or a URL it connects
to (streamable HTTP). Read from config.toml's `[mcp.servers.NAME]` tables and from the `mcpServers` entries
of the JSON file other apps share (Claude Desktop, Cursor, LM Studio); both go through `server_entry`, so a
mistake reads the same wherever it was made: one sentence naming the file and the key."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Letters, digits, - and _; no "__" and no trailing "_": a clashing tool is offered as "server__tool"
# (tool_names.py), which must split back at its first "__"; no ".": the allow-list's globs read "server.tool".
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
MAX_SERVER_NAME = 40


class McpConfigError(ValueError):
    """An MCP setting cannot be used; the message names the file and the key (config.py passes it on as its
    own ConfigError)."""


@dataclass(frozen=True)
class StdioServer:
    """A server kvchat runs as a child process and speaks to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)  # over the safe defaults (server_process.py)
    cwd: Path | None = None  # None: the folder kvchat was started in
    timeout: float | None = None  # seconds a call may take; None: the hub's default


@dataclass(frozen=True)
class HttpServer:
    """A server kvchat reaches at a URL (MCP's streamable HTTP transport)."""

    url: str
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    timeout: float | None = None


ServerSpec = StdioServer | HttpServer
DISABLED = None  # what server_entry returns for an entry with `disabled = true`

STDIO_KEYS = ("command", "args", "env", "cwd")
HTTP_KEYS = ("url", "headers")
COMMON_KEYS = ("timeout", "disabled")
# mcp.json's "type" values that mean streamable HTTP, as the apps that share the file spell it.
HTTP_TYPES = ("http", "streamable-http", "streamableHttp", "streamable_http")


def check_server_name(name: str, fail) -> None:
    if len(name) > MAX_SERVER_NAME or not SERVER_NAME.fullmatch(name) or "__" in name or name.endswith("_"):
        fail("", f"is not a usable server name: letters, digits, - and single _, at most {MAX_SERVER_NAME} "
                 "characters")


def server_entry(name: str, raw: object, prefix: str, path: Path, *, strict: bool) -> ServerSpec | None:
    """The server `raw` describes, or DISABLED. `prefix` is how the entry is named in messages
    ("mcp.servers.git", "mcpServers.git"); `strict` refuses keys kvchat does not know (config.toml is
    kvchat's own; mcp.json carries other apps' keys, which are left alone). Relative paths (cwd) are read
    from the folder of the file that names them."""
    where = "config file" if strict else "MCP config file"

    def fail(key: str, rule: str):
        raise McpConfigError(f"in the {where} {path}, {prefix}{key} {rule}")

    check_server_name(name, fail)
    if not isinstance(raw, dict):
        fail("", "must be a table of settings (command and args, or url)")
    if strict:
        for key in raw:
            if key not in STDIO_KEYS + HTTP_KEYS + COMMON_KEYS:
                fail(f".{key}", f"is not a server setting (known: {', '.join(STDIO_KEYS + HTTP_KEYS + COMMON_KEYS)})")
    disabled = raw.get("disabled", False)
    if not isinstance(disabled, bool):
        fail(".disabled", "must be true or false")
    if disabled:
        return DISABLED
    kind = raw.get("type")
    if not strict and kind is not None and kind not in ("stdio", *HTTP_TYPES):
        fail(".type", f"= {kind!r} is not supported (kvchat speaks stdio and streamable HTTP)")
    if "command" in raw and "url" in raw:
        fail("", "has both command and url; keep one (a command for stdio, a url for streamable HTTP)")
    if "command" not in raw and "url" not in raw:
        fail("", "needs a command (a server kvchat starts) or a url (a streamable HTTP server)")
    timeout = raw.get("timeout") if strict else None  # other apps' timeouts differ in unit; ours is seconds
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        fail(".timeout", "must be a number of seconds above 0")
    if "url" in raw:
        return _http_server(raw, timeout, fail, strict)
    return _stdio_server(raw, timeout, fail, strict, path)


def _stdio_server(raw: dict, timeout, fail, strict: bool, path: Path) -> StdioServer:
    if strict and (extra := [key for key in HTTP_KEYS if key in raw]):
        fail(f".{extra[0]}", "is for a url (streamable HTTP) server, not a command")
    command = raw["command"]
    if not isinstance(command, str) or not command.strip():
        fail(".command", "must be the program to run (a string)")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        fail(".args", "must be a list of strings")
    env = _string_table(raw.get("env", {}), ".env", fail)
    cwd = raw.get("cwd")
    if cwd is not None and not (isinstance(cwd, str) and cwd.strip()):
        fail(".cwd", "must be the path of a folder")
    folder = None if cwd is None else path.parent / Path(cwd).expanduser()
    program = str(Path(command).expanduser()) if command.startswith("~") else command
    return StdioServer(program, tuple(args), env, folder, timeout)


def _http_server(raw: dict, timeout, fail, strict: bool) -> HttpServer:
    if strict and (extra := [key for key in STDIO_KEYS if key in raw]):
        fail(f".{extra[0]}", "is for a command (stdio) server, not a url")
    url = raw["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        fail(".url", "must be an http:// or https:// URL")
    return HttpServer(url, _string_table(raw.get("headers", {}), ".headers", fail), timeout)


def _string_table(value, key: str, fail) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        fail(key, "must be a table of strings (NAME = \"value\")")
    return dict(value)
