"""`kvchat serve`: the embedded engine behind an OpenAI-compatible HTTP API (app/server/api.py).

Takes --host/--port first (127.0.0.1:8000 by default: only this machine can reach it unless told
otherwise), so a port in use or a bad --host is one sentence and exit 1 before the model loads;
a client that connects while the model loads waits for it. Then loads the model once and serves on
that socket with uvicorn. SIGINT (Ctrl+C), SIGTERM and SIGHUP (the terminal closed) stop it alike:
every reply in progress ends (app/server/runner.py's EngineRunner.stop), connections still open after
SHUTDOWN_GRACE_S are closed, the engine thread ends, and the exit code is 128 + the signal's number
(130, 143, 129). Needs the `serve` extra (FastAPI and uvicorn).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys

from app.cli.options import engine_options

INSTALL_HINT = "the serve command needs FastAPI and uvicorn; install them with: pip install 'kvchat[serve]'"
SHUTDOWN_GRACE_S = 3  # after the replies were cut: a client that stopped reading its stream holds no longer


class ListenError(Exception):
    """The address cannot be served on; the message is one sentence."""


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address is bracketed


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening; ListenError (one sentence) if it cannot be."""
    where = address(host, port)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ListenError(f"cannot listen on {where}: the host is not known ({reason}); check --host") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart within TIME_WAIT
        sock.bind(sockaddr)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"{where} is already in use (another server?); stop it or pick another --port") \
                from None
        raise ListenError(f"cannot listen on {where} ({exc.strerror or exc}); check --host and --port") from None
    return sock


def _say(message: str) -> None:
    try:
        print(f"kvchat: {message}", file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP): nobody reads it
        pass


def run_serve(args: argparse.Namespace) -> int:
    try:  # only whether they are installed; _serve imports them for use
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        _say(f"{INSTALL_HINT}.")
        return 1
    try:
        sock = listen(args.host, args.port)
    except ListenError as exc:
        _say(f"{exc}.")
        return 1
    try:
        return _serve(args, sock)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, sock: socket.socket) -> int:
    """Load the model, then serve on `sock` until a signal; the exit code."""
    import uvicorn

    from app.chat.prompt.format_choice import model_chat_format, no_template_notice
    from app.server.api import create_app
    from app.server.guards import allowed_host_names
    from app.server.runner import EngineRunner
    from app.server.serve_thread import Server
    from engine import Engine

    progress = lambda step: _say(f"{step}…")  # noqa: E731
    runner = EngineRunner()
    try:
        # Loaded on the thread that generates: torch's OpenMP team belongs to the thread that starts it, and
        # a second team (main thread + engine thread) halved decode speed here (see app/tui/engine_thread.py).
        engine = runner.run(lambda: Engine.load(engine_options(args),
                                                progress=progress if sys.stderr.isatty() else lambda _: None))
        api_key = args.api_key or os.environ.get("KVCHAT_API_KEY") or None
        host_names = allowed_host_names(args.host, sock.getsockname()[0], args.allowed_host)
        app = create_app(engine, api_key=api_key, runner=runner, host_names=host_names)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
        server = Server(config, on_shutdown=runner.stop)
        kv = "" if engine.info.kv_dtype == engine.info.dtype else f", K/V {engine.info.kv_dtype}"
        _say(f"serving {engine.info.model_name} ({engine.info.device}, {engine.info.dtype}{kv}) at "
             f"http://{address(args.host, args.port)}/v1{' (API key required)' if api_key else ''}")
        if (chat_format := model_chat_format(engine)) is not None:  # never a silent guess
            _say(f"{no_template_notice(chat_format)[:-1]} for chat requests.")
        server.run(sockets=[sock])
    finally:
        runner.close()  # also when a second signal skipped the app's own shutdown
    if server.signal is None:
        return 0
    _say(f"stopped ({signal.Signals(server.signal).name}).")
    return 128 + server.signal
