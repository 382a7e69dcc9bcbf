"""An ASGI app served by uvicorn on a free loopback port, in a thread, for the length of a `with` block."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def wait_until(condition, timeout: float = 10.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Server:
    def __init__(self, app, log_level: str = "warning"):
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="test-uvicorn")

    def __enter__(self) -> "Server":
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), what="the server to start")
        assert self.server.started, "the server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"
