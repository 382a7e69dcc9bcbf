"""No MCP server outlives kvchat: after a `kill -9` of the process that started it (which runs no cleanup;
the kernel's death signal ends the server), and after close() (the server's whole process group ends,
programs it started included)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.tools.mcp.hub import McpHub
from app.tools.mcp.server_entry import StdioServer
from app.tools.mcp.settings import McpSettings
from app.tools.spec import ToolCall

pytestmark = pytest.mark.slow  # seconds each: a server's start, a child Python, a process group's end

REPO = Path(__file__).resolve().parents[4]
HOSTILE = Path(__file__).with_name("hostile_server.py")
GONE_WAIT_S = 10.0  # a dead process leaves /proc within milliseconds; this is only the hang guard

# A kvchat stand-in: starts a hub with one server, prints the server's pid, and dies by SIGKILL.
KILLED_PARENT = f"""
import os, signal, sys
from pathlib import Path
from app.tools.mcp.hub import McpHub
from app.tools.mcp.server_entry import StdioServer
from app.tools.mcp.settings import McpSettings
from app.tools.spec import ToolCall
hub = McpHub(McpSettings({{"hostile": StdioServer(sys.executable, ({str(HOSTILE)!r},))}}), log_dir=Path(sys.argv[1]))
print(hub.call(ToolCall("pid", {{}})).text, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie is dead: it only waits for a parent to read its exit status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def end(pid: int) -> None:
    """Clean up after a failed test: no stray server left for the next."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_a_kvchat_killed_by_sigkill(tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED_PARENT, str(tmp_path)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    server = int(child.stdout.strip())
    try:
        assert gone_within(server, GONE_WAIT_S)
    finally:
        end(server)


def test_close_ends_the_server_and_what_it_started(tmp_path):
    hub = McpHub(McpSettings({"hostile": StdioServer(sys.executable, (str(HOSTILE),))}), log_dir=tmp_path)
    server = int(hub.call(ToolCall("pid", {})).text)
    sleeper = int(hub.call(ToolCall("spawn_sleeper", {})).text)
    assert alive(server) and alive(sleeper)
    try:
        hub.close()
        assert gone_within(server, GONE_WAIT_S) and gone_within(sleeper, GONE_WAIT_S)
        assert hub.status()["hostile"].state == "closed"
    finally:
        end(server)
        end(sleeper)
