"""ServerThread: an ASGI app served by uvicorn on a free loopback port, in a background thread, for the
length of a `with` block (`kvchat bench --serve`, and the tests that need a live server)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class ServerThread:
    def __init__(self, app, log_level: str = "warning", port: int = 0):
        """`port` 0: the system picks a free one, held until the server takes it."""
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a stopped server just left
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="kvchat-uvicorn")

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self.server.started:
            self.__exit__()
            raise RuntimeError("the HTTP server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()
        if self.thread.is_alive():
            raise RuntimeError("the HTTP server did not stop")
