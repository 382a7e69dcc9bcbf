"""McpHub over streamable HTTP: a server (the SDK's MCPServer app under uvicorn, in a thread of the test, on a
free local port) listed and called with the configured headers; a URL nobody answers is one sentence."""

import socket
import threading
import time

import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from app.tools.mcp.hub import McpHub
from app.tools.mcp.server_entry import HttpServer
from app.tools.mcp.settings import McpSettings
from app.tools.spec import ToolCall

web = MCPServer("web")


@web.tool()
def shout(text: str) -> str:
    return text.upper() + "\x1b[5m!"


@web.tool()
def header(name: str, ctx: Context) -> str:
    return (ctx.headers or {}).get(name.lower(), "absent")


pytestmark = pytest.mark.xdist_group("mcp-http")  # one xdist worker starts the server(s) (--dist loadgroup)


@pytest.fixture(scope="module")
def url():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound before the server starts: no race for the port
    server = uvicorn.Server(uvicorn.Config(web.streamable_http_app(), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    server.should_exit = True
    thread.join(10)


def test_a_streamable_http_servers_tools_are_listed_and_called_with_its_headers(url, tmp_path):
    settings = McpSettings({"web": HttpServer(url, {"X-Api-Key": "k-123"})})
    with McpHub(settings, log_dir=tmp_path) as hub:
        assert {(spec.name, spec.server) for spec in hub.tools()} == {("shout", "web"), ("header", "web")}
        result = hub.call(ToolCall("shout", {"text": "hello"}))
        assert (result.text, result.is_error) == ("HELLO!", False)  # cleaned like any server's text
        assert hub.call(ToolCall("header", {"name": "X-Api-Key"})).text == "k-123"


def test_a_url_nobody_answers_is_one_sentence(tmp_path):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port that is ours and not listening
    port = closed.getsockname()[1]
    settings = McpSettings({"gone": HttpServer(f"http://127.0.0.1:{port}/mcp")})
    with McpHub(settings, log_dir=tmp_path) as hub:
        assert hub.tools() == []
        problem = hub.status()["gone"].problem
        assert problem.startswith(f"the MCP server 'gone' at http://127.0.0.1:{port}/mcp could not be reached (")
        assert "\n" not in problem
    closed.close()
