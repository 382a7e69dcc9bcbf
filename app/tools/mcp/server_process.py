"""A stdio MCP server as a child process that cannot outlive kvchat.

Each server runs in its own session (so its process group is its own, and a signal to the group reaches
whatever it started). On Linux it is also started through LAUNCHER, a few lines of Python that ask the
kernel to SIGKILL the process when kvchat dies (PR_SET_PDEATHSIG) and then exec the server: after a
`kill -9` of kvchat, which runs no cleanup, no server is left behind. The launcher, not a preexec_fn,
because kvchat is multi-threaded (engine, UI) and Python code between fork and exec in a threaded process
can deadlock on a lock another thread held; the launcher is a fresh single-threaded process (about 20 ms).
The death signal follows the thread that forked the child, so servers are spawned from the MCP hub's
event-loop thread, which lives as long as they do. Programs the server starts itself stay in its group
(`stop` ends them) but do not inherit the death signal; they see their stdin close when it dies.

The server's stderr goes to its log file (never to the terminal, where it would paint over the chat).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree

from app.tools.mcp.server_entry import StdioServer

STDIN_GRACE_S = 0.5  # a server told to stop by the end of its stdin (the spec's way) has this long
TERM_GRACE_S = 2.0  # then SIGTERM to its group, and this long before SIGKILL
REAP_WAIT_S = 1.0
LOG_ROTATE_BYTES = 1 << 20  # a log over a MiB at a server's start moves to NAME.log.1 (one old log kept)
# Variables every server gets besides its own `env`: the SDK's safe few (HOME, PATH, ...; not the user's
# API keys) and the locale, so a server's text is decoded as the user's.
EXTRA_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ")
PR_SET_PDEATHSIG = 1
LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)  # kvchat died before the line above took effect\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n")


class ServerStartError(Exception):
    """The server cannot be started; the message is one sentence."""


def server_env(spec: StdioServer) -> dict[str, str]:
    inherited = {key: os.environ[key] for key in EXTRA_ENV if key in os.environ}
    return get_default_environment() | inherited | spec.env


def executable(name: str, spec: StdioServer, env: dict[str, str]) -> str:
    """The program's path, found as the shell would (PATH from the server's environment; a path with a /
    from the server's folder). Raises ServerStartError naming the command."""
    if "/" in spec.command:
        found = Path(spec.cwd or ".") / spec.command
        if found.is_file() and os.access(found, os.X_OK):
            return str(found.absolute())
    elif found := shutil.which(spec.command, path=env.get("PATH", os.defpath)):
        return os.path.abspath(found)
    raise ServerStartError(f"the command {spec.command!r} of the MCP server {name!r} was not found")


def launch_argv(program: str, args: tuple[str, ...]) -> list[str]:
    if sys.platform.startswith("linux") and sys.executable and not getattr(sys, "frozen", False):
        return [sys.executable, "-I", "-S", "-c", LAUNCHER, str(os.getpid()), program, *args]
    return [program, *args]  # no death signal elsewhere: close() and the server's own stdin EOF remain


def open_log(path: Path):
    """The server's log, appended to (binary, for the child's stderr); rotated once it is over a MiB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    return open(path, "ab")


async def spawn(name: str, spec: StdioServer, log_path: Path) -> Process:
    """The server's process, its stdin and stdout piped to kvchat. Raises ServerStartError."""
    env = server_env(spec)
    if spec.cwd is not None and not spec.cwd.is_dir():
        raise ServerStartError(f"the folder {str(spec.cwd)!r} of the MCP server {name!r} does not exist")
    program = executable(name, spec, env)
    with open_log(log_path) as log:
        try:
            return await anyio.open_process(launch_argv(program, spec.args), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, cwd=spec.cwd, env=env,
                                            start_new_session=True)
        except OSError as exc:
            raise ServerStartError(f"the MCP server {name!r} could not be started ({exc.strerror or exc})") from None


async def stop(process: Process) -> None:
    """End the server and its group: its stdin closed (servers exit on that), then SIGTERM to the group,
    then SIGKILL. Bounded: at most STDIN_GRACE_S + TERM_GRACE_S + REAP_WAIT_S."""
    with anyio.CancelScope(shield=True):
        try:
            await process.stdin.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        with anyio.move_on_after(STDIN_GRACE_S):
            while process.returncode is None:
                await anyio.sleep(0.01)
        # The group may hold programs the server started even when the server itself has exited.
        await terminate_posix_process_tree(process, TERM_GRACE_S)
        with anyio.move_on_after(REAP_WAIT_S):
            while process.returncode is None:
                await anyio.sleep(0.01)


def exit_note(returncode: int | None) -> str:
    """How the process ended, for a sentence: "exit code 3", "killed by SIGKILL"."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
