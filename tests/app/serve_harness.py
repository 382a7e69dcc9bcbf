"""Live servers for tests: app/server/serve_thread.py's ServerThread, and waiting on what they do."""

from __future__ import annotations

import time

from app.server.serve_thread import ServerThread as Server  # noqa: F401  (the tests' name for it)


def wait_until(condition, timeout: float = 10.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
