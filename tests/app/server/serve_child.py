"""`kvchat serve` in a child process (`python -m app.cli serve`), for the tests that send it signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spawn_with_default_hangup(*args, **kwargs) -> subprocess.Popen:
    # A test run under nohup ignores SIGHUP, and its children would inherit that; the server keeps a
    # signal it finds ignored ignored, so the child starts with the default, as from a terminal. Set
    # here around the spawn, not in a preexec_fn: that would make Python fork instead of vfork, and a
    # fork of a test process holding several engines can fail for lack of memory to commit.
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        return subprocess.Popen(*args, **kwargs)
    finally:
        signal.signal(signal.SIGHUP, previous)


class ServeChild:
    """The server on a free loopback port, answering, for the length of a `with` block (killed if still
    alive at its end). `stderr` is what it wrote there, once it has exited."""

    def __init__(self, model_dir: Path, log: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.command = [sys.executable, "-m", "app.cli", "serve", "--model", str(model_dir), "--device", "cpu",
                        "--kv-cache-gb", "0.05", "--port", str(self.port), *args]

    def __enter__(self) -> "ServeChild":
        self.out = self.log.open("wb")
        self.process = _spawn_with_default_hangup(self.command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.out,
                                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.url}/models", timeout=5)  # any answer (a 401 with --api-key): it is up
                return self
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"kvchat serve did not start: {self.stderr}") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.out.close()

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


class StreamReader:
    """One streaming chat request's SSE lines, read on a daemon thread; `error` if the read failed."""

    def __init__(self, url: str, body: dict):
        self.lines: list[str] = []
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self.thread.start()

    def _read(self, url: str, body: dict) -> None:
        try:
            with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    if line:
                        self.lines.append(line)
        except Exception as exc:  # the test says what it expected
            self.error = exc

    def chunks(self) -> int:
        return sum(line.startswith("data: {") for line in self.lines)
