"""`kvchat serve`: the embedded engine behind an OpenAI-compatible HTTP API (app/openai_api.py).

Loads the model once, then runs uvicorn on --host/--port (127.0.0.1:8000 by
default: only this machine can reach it unless told otherwise). Needs the
`serve` extra (FastAPI and uvicorn).
"""

from __future__ import annotations

import argparse
import os
import sys

from app.options import engine_options

INSTALL_HINT = "the serve command needs FastAPI and uvicorn; install them with: pip install 'kvchat[serve]'"


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        print(f"kvchat: {INSTALL_HINT}.", file=sys.stderr)
        return 1
    from app.openai_api import create_app
    from app.openai_runner import EngineRunner
    from engine import Engine

    progress = lambda step: print(f"kvchat: {step}…", file=sys.stderr)  # noqa: E731
    runner = EngineRunner()
    # Loaded on the thread that generates: torch's OpenMP team belongs to the thread that starts it, and
    # a second team (main thread + engine thread) halved decode speed here (see app/engine_thread.py).
    try:
        engine = runner.run(lambda: Engine.load(engine_options(args),
                                                progress=progress if sys.stderr.isatty() else lambda _: None))
    except BaseException:
        runner.close()
        raise
    api_key = args.api_key or os.environ.get("KVCHAT_API_KEY") or None
    app = create_app(engine, api_key=api_key, runner=runner)
    print(f"kvchat: serving {engine.info.model_name} ({engine.info.device}, {engine.info.dtype}) at "
          f"http://{args.host}:{args.port}/v1{' (API key required)' if api_key else ''}", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
