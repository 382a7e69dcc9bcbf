"""`kvchat ask`: answer one message, streaming to stdout (or one JSON line with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from app.chat import ChatSession
from app.options import engine_options, sampling_params
from engine import Done, Engine, EngineError, TokenDelta


def read_message(arg: str) -> str:
    message = sys.stdin.read() if arg == "-" else arg
    if not message.strip():
        raise ValueError("the message is empty")
    return message


def stats_line(done: Done) -> str:
    s = done.stats
    return (f"[{s.ttft_ms:.0f} ms to first token · {s.prompt_tokens} prompt tokens "
            f"({s.cached_tokens} cached, {s.prefilled_tokens} computed) · {s.generated_tokens} tokens "
            f"at {s.decode_tokens_per_s:.1f} tok/s · {done.finish_reason}]")


def result_json(done: Done, engine: Engine) -> dict:
    return {
        "conversation_id": None,
        "reply": done.text,
        "finish_reason": done.finish_reason,
        **done.stats.as_dict(),
        "model": engine.info.model_name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "load_ms": round(engine.info.load_ms, 1),
        "kv_cache": engine.cache_stats(),
    }


def run_ask(args: argparse.Namespace) -> int:
    message = read_message(args.message)
    params = sampling_params(args)
    progress = lambda step: print(f"kvchat: {step}…", file=sys.stderr)  # noqa: E731
    engine = Engine.load(engine_options(args), progress=progress if sys.stderr.isatty() else lambda _: None)
    session = ChatSession(engine, system=args.system, params=params)
    done = None
    try:
        for event in session.send(message):
            if isinstance(event, TokenDelta) and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Done):
                done = event
    except KeyboardInterrupt:
        session.cancel()
        if not args.json:
            sys.stdout.write("\n")
        print("kvchat: stopped.", file=sys.stderr)
        return 130
    if done is None:
        raise EngineError("The reply ended without a result.")
    if args.json:
        print(json.dumps(result_json(done, engine), ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        print(stats_line(done), file=sys.stderr)
    return 0
