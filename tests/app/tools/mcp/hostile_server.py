"""An MCP server (stdio) whose tools misbehave the ways servers do, for the hub's tests: hang, crash, flood,
paint the terminal, send bytes that are not UTF-8, lone surrogates and lines that are not JSON-RPC. Run as
`python hostile_server.py`; `--http PORT` serves the same tools over streamable HTTP instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer

server = MCPServer("hostile")
# The pipe to the client, kept before the SDK takes it (it points fd 1 at stderr, so that stray prints
# cannot corrupt the protocol: exactly what these tools mean to do).
WIRE = os.dup(sys.stdout.fileno())


def write_raw(data: bytes) -> None:
    """Bytes straight onto the client's pipe, past the SDK's writer (idle while a tool runs)."""
    os.write(WIRE, data)


def raw_answer(ctx: Context, text_json: bytes) -> None:
    """A JSON-RPC answer to this very call written by hand, `text_json` being the text part's JSON string
    (quotes included). The SDK's own answer follows it and is dropped by the client as a duplicate."""
    request_id = int(ctx.request_id) if ctx.request_id.isdigit() else ctx.request_id
    head = b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode() + b',"result":{"content":[{"type":"text","text":'
    write_raw(head + text_json + b"}]}}\n")


@server.tool()
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool()
def pid() -> str:
    return str(os.getpid())


@server.tool()
def spawn_sleeper() -> str:
    """Starts a grandchild (in the server's process group) and returns its pid."""
    return str(subprocess.Popen(["sleep", "300"]).pid)


@server.tool()
async def hang() -> str:
    await anyio.sleep_forever()
    return "never"


@server.tool()
def crash() -> str:
    os._exit(3)


@server.tool()
def exit_soon() -> str:
    """Answers, then exits on its own a moment later (as a server whose idle timer ran out)."""
    threading.Timer(0.2, os._exit, (0,)).start()
    return "exiting soon"


@server.tool(structured_output=False)
def malformed_result(ctx: Context) -> str:
    """Answers with a result whose content is not a list of parts."""
    request_id = int(ctx.request_id) if ctx.request_id.isdigit() else ctx.request_id
    write_raw(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"content": "not a list"}}).encode() + b"\n")
    return "late"


@server.tool()
def flood(megabytes: int) -> str:
    return "line of text " * (megabytes * (1 << 20) // 13)


@server.tool()
def spill() -> str:
    """Three megabytes of text whatever the model asks (flood's size is an argument the model would pick)."""
    return "line of text " * (3 * (1 << 20) // 13)


@server.tool()
def paint() -> str:
    return ("\x1b[2J\x1b[31mred\x1b[0m \x1b]0;owned title\x07\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\ "
            "bell\x07 back\x08space car\rriage \u202eevil\u202c \x9b31m c1 \x00nul\ttab\nnext line")


@server.tool(structured_output=False)  # the hand-written answer carries no structured content
def invalid_utf8(ctx: Context) -> str:
    raw_answer(ctx, b'"bad \xff\xfe bytes \xc3 end"')
    return "late"


@server.tool(structured_output=False)
def lone_surrogate(ctx: Context) -> str:
    raw_answer(ctx, b'"half \\ud800 pair"')
    return "late"


@server.tool()
def garbage_then_answer() -> str:
    write_raw(b"\x00\xffthis is {not json-rpc\n")
    return "answered after garbage"


@server.tool()
async def garbage_then_hang() -> str:
    write_raw(b"Traceback (most recent call last): oops\n")
    await anyio.sleep_forever()
    return "never"


@server.tool()
def bad_notification() -> str:
    """Sends a progress notification without its required fields (the SDK's client logs a warning)."""
    write_raw(b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"bogus":1}}\n')
    return "sent a bad notification"


@server.tool()
def to_stderr() -> str:
    print("a server's chatter on stderr", file=sys.stderr, flush=True)
    return "said something on stderr"


@server.tool()
def picture() -> Image:
    return Image(data=b"\x89PNG\r\n\x1a\n" + bytes(1000), format="png")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run()
