"""Terminal: one kvchat process in a detached tmux pane on a private tmux server, read as a user sees it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
KVCHAT = [sys.executable, "-m", "tests.app.cli.cli_child"]  # kvchat, with the test knobs of tests/app/cli/cli_child.py
EXIT_S = 30.0  # a deadline for a slow CI machine
POLL_S = 0.2


class Terminal:
    """One kvchat process in a detached 160x45 tmux pane, on a private tmux server."""

    def __init__(self, home: Path, scratch: Path):
        self.home = home
        self.socket = f"kvchat-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.exit_file = scratch / f"{self.socket}.exit"
        self.env = {k: v for k, v in os.environ.items() if k != "TMUX"}  # even when pytest runs inside tmux
        self.last_screen = ""
        self.socket_path = ""

    def tmux(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                                text=True, env=self.env, timeout=30)
        assert result.returncode == 0, f"tmux {' '.join(args)}: {result.stderr}\n{self.report()}"
        return result.stdout

    def start(self, *kvchat_args: str, env: dict[str, str] | None = None) -> None:
        # A shell waits for kvchat and writes its exit status to a file: tmux's own #{pane_dead_status} is
        # not reliable here (tmux 3.3a sometimes leaves the exited process a zombie for many seconds).
        # remain-on-exit keeps the pane, so whatever kvchat printed on its way out can still be read.
        extra = [f"{name}={value}" for name, value in (env or {}).items()]
        kvchat = shlex.join(["env", f"KVCHAT_HOME={self.home}", "TERM=xterm-256color", *extra, *KVCHAT, *kvchat_args])
        command = f"{kvchat}; echo $? > {shlex.quote(str(self.exit_file))}"
        self.tmux("new-session", "-d", "-s", "kvchat", "-x", "160", "-y", "45", "-c", str(REPO), command,
                  ";", "set-option", "-g", "remain-on-exit", "on")
        self.socket_path = self.tmux("display-message", "-p", "#{socket_path}").strip()

    def screen(self) -> str:
        self.last_screen = self.tmux("capture-pane", "-p", "-t", "kvchat")
        return self.last_screen

    def exit_status(self) -> int | None:
        """None while kvchat runs, else its exit status."""
        written = self.exit_file.read_text() if self.exit_file.exists() else ""
        return int(written) if written.endswith("\n") else None

    def wait_for(self, what: str, found, timeout: float):
        """Poll the screen until `found(screen)` is truthy (returns it); fail early if kvchat exits."""
        deadline = time.monotonic() + timeout
        while True:
            result = found(self.screen())
            if result:
                return result
            status = self.exit_status()
            if status is not None:
                self.screen()
                raise AssertionError(f"kvchat exited ({status}) while waiting for {what}\n{self.report()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout:.0f} s\n{self.report()}")
            time.sleep(POLL_S)

    def send(self, text: str) -> None:
        self.tmux("send-keys", "-t", "kvchat", "-l", text)
        self.tmux("send-keys", "-t", "kvchat", "Enter")

    def quit(self) -> int:
        """ctrl+q, then wait for the process to end; returns its exit status."""
        self.tmux("send-keys", "-t", "kvchat", "C-q")
        deadline = time.monotonic() + EXIT_S
        while (status := self.exit_status()) is None:
            if time.monotonic() > deadline:
                self.screen()
                raise AssertionError(f"kvchat still running {EXIT_S:.0f} s after ctrl+q\n{self.report()}")
            time.sleep(POLL_S)
        self.screen()  # what it printed on the way out (a traceback, if any)
        return status

    def report(self) -> str:
        return f"--- last screen ---\n{self.last_screen.rstrip()}\n-------------------"

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, env=self.env, timeout=30)
        if self.socket_path:  # tmux leaves the socket file behind
            Path(self.socket_path).unlink(missing_ok=True)

    def kvchat_pid(self) -> int:
        """The kvchat process (the child of the pane's shell)."""
        shell = self.tmux("display-message", "-p", "-t", "kvchat", "#{pane_pid}").strip()
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        assert children, f"kvchat is not running\n{self.report()}"
        return int(children[0])
