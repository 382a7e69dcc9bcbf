"""How kvchat runs uvicorn: Server (a shutdown that ends every generation first, on SIGINT, SIGTERM or
SIGHUP alike) for `kvchat serve`, and ServerThread, an ASGI app on a free loopback port in a background
thread for the length of a `with` block (`kvchat bench --serve`, and the tests that need a live server)."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn

# Ctrl+C, `kill`, and the terminal closing. A signal that was ignored when the server started (SIGHUP
# under nohup) stays ignored.
SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Server(uvicorn.Server):
    """uvicorn's server, whose shutdown first calls `on_shutdown` (EngineRunner.stop: every generation
    ends before its next step, so no open stream holds the shutdown up), then waits for open connections
    as uvicorn does, at most config.timeout_graceful_shutdown seconds.

    Run on the main thread, each of SHUTDOWN_SIGNALS starts that shutdown and a second one stops the
    waiting; `signal` is then the first one's number. Unlike uvicorn, the signal is not raised again
    once the server has stopped: the caller exits with its own code (run_serve: 128 + the number).
    """

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] = lambda: None):
        super().__init__(config)
        self.on_shutdown = on_shutdown
        self.signal: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in SHUTDOWN_SIGNALS}
        for sig, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(sig, self.handle_exit)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        # Only flags here: a signal handler may run between any two bytecodes of the event loop's thread.
        self.signal = self.signal or sig
        self.force_exit = self.should_exit
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets=sockets)


class ServerThread:
    def __init__(self, app, log_level: str = "warning", port: int = 0,
                 on_shutdown: Callable[[], None] = lambda: None):
        """`port` 0: the system picks a free one, held until the server takes it. `on_shutdown`: see Server."""
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a stopped server just left
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        self.server = Server(config, on_shutdown)
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
