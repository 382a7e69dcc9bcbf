"""`kvchat ask`: answer one message in a saved conversation, streaming to stdout (or one JSON line with --json)."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from app.backend import Backend, backend_loader, chat_session
from app.chat import ChatSession
from app.conversations_cli import stats_line
from app.options import sampling_params
from app.saved_chat import SavedConversation, Storage, reply_stats, sampling_settings
from engine import Done, EngineError, TokenDelta


def read_message(arg: str) -> str:
    message = sys.stdin.read() if arg == "-" else arg
    if not message.strip():
        raise ValueError("the message is empty")
    return message


def result_json(done: Done, engine: Backend, conversation_id: str) -> dict:
    return {
        "conversation_id": conversation_id,
        "reply": done.text,
        "finish_reason": done.finish_reason,
        **done.stats.as_dict(),
        "model": engine.info.model_name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "load_ms": round(engine.info.load_ms, 1),
        "kv_cache": engine.cache_stats(),
    }


def open_session(args: argparse.Namespace, engine: Backend, storage: Storage) -> ChatSession:
    """A new saved conversation, or the one named by --conversation with its settings (flags override them)."""
    if args.conversation is None:
        params = sampling_params(args)
        return chat_session(engine, args.system, params, SavedConversation.new(storage, engine, args.system, params))
    saved = SavedConversation.open(storage, args.conversation)
    params = sampling_params(args, saved.conversation.params)
    system = saved.conversation.system if args.system is None else args.system
    if (system, sampling_settings(params)) != (saved.conversation.system, saved.conversation.params):
        saved.update_settings(system=system, params=sampling_settings(params))
    return chat_session(engine, system, params, saved)


def run_ask(args: argparse.Namespace) -> int:
    message = read_message(args.message)
    sampling_params(args)  # bad flags fail before the model loads
    progress = lambda step: print(f"kvchat: {step}…", file=sys.stderr)  # noqa: E731
    storage = Storage.open(args.snapshot_gb)
    try:
        engine = backend_loader(args)(args.model, progress if sys.stderr.isatty() else lambda _: None)
        session = open_session(args, engine, storage)  # a discarded snapshot was logged to stderr
        done = _answer(session, message, stream=not args.json)
        if args.json:
            print(json.dumps(result_json(done, engine, session.saved.id), ensure_ascii=False))
        else:
            print(stats_line(reply_stats(done)), file=sys.stderr)
            print(f"kvchat: conversation {session.saved.id} (continue it with --conversation {session.saved.id})",
                  file=sys.stderr)
        return 130 if done.finish_reason == "stopped" else 0
    finally:
        storage.close()  # waits for the KV snapshot, so the next `ask --conversation` resumes from it


def _answer(session: ChatSession, message: str, stream: bool) -> Done:
    """Send the message and stream the reply. Ctrl+C stops the reply (kept, as stopped); a second one quits."""
    interrupts = 0

    def on_interrupt(signum, frame) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            raise KeyboardInterrupt
        session.cancel()  # the stream ends with Done("stopped") before the next token
        print("\nkvchat: stopping…", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    done = None
    try:
        for event in session.send(message):
            if isinstance(event, TokenDelta) and stream:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Done):
                done = event
    finally:
        signal.signal(signal.SIGINT, previous)
    if done is None:
        raise EngineError("The reply ended without a result.")
    if stream:
        sys.stdout.write("\n")
    return done
