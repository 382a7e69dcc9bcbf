"""`kvchat ask`: answer one message in a saved conversation, streaming to stdout (or one JSON line with --json).

Stopping: Ctrl+C, SIGTERM and SIGHUP (a closed terminal window, a logout)
all stop the reply the same way: what it said is kept as `stopped`, its K/V
blocks are written, and the exit code is 128 + the signal (130, 143, 129). A
reader of stdout that goes away (`| head`) stops it too, exit 141. A second
signal quits at once (the reply is then kept as interrupted).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from typing import TYPE_CHECKING

from app.chat.reply.limits import reply_limits
from app.chat.sampling_settings import given_settings, sampling_params
from app.chat.reply.stats import stats_line
from app.chat.terminal_text import BROKEN_PIPE_EXIT, SafeOutput, clean_input, printable, say, silence
from app.cli.ask_overflow import OverflowWay
from app.cli.ask_tools import check_tool_flags, open_tools
from app.cli.ask_raw import RawCompletion, check_raw_flags
from storage.db.conversations import ConversationStore
from storage.errors import StorageError

if TYPE_CHECKING:  # torch and the model stack (about a second): imported once the request is known good
    from app.chat.backend import Backend
    from app.chat.session import ChatSession
    from app.chat.saved.conversation import SavedConversation, Storage
    from engine import Done

# How long `ask --conversation ID` waits for another kvchat's reply in the same conversation to end.
TURN_WAIT_S = 30.0
STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])


def read_message(arg: str) -> str:
    message = clean_input(None if arg == "-" else arg, "The message", stdin=arg == "-")
    if not message.strip():
        raise ValueError("the message is empty")
    return message


def result_json(done: Done, engine: Backend, conversation_id: str | None, chat_format: str | None = None) -> dict:
    """`chat_format`: the standard format the prompt was written in (prompt/formats.py), for a model without
    a chat template; None: the model's (or the server's) own template, or `--raw`'s text as is."""
    return {
        "conversation_id": conversation_id,
        "chat_format": chat_format,
        "reply": done.text,
        "finish_reason": done.finish_reason,
        **done.stats.as_dict(),
        "model": engine.info.model_name,
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "kv_dtype": engine.info.kv_dtype,
        "speculative": engine.info.speculative,  # the setting; the counts above say what it did
        "load_ms": round(engine.info.load_ms, 1),
        "kv_cache": engine.cache_stats(),
    }


def thinking_json(session: ChatSession, done: Done) -> dict:
    """`--json`'s reply split: `reply` is the answer alone, `thinking` the reasoning (null: none), and
    their tokens apart (for a reply without thinking, all its tokens are the answer's)."""
    from app.chat.prompt.thinking import split_reply

    parts = split_reply(done.text, session.opens_thinking)
    stats = session.messages[-1].stats if session.messages and session.messages[-1].stats else {}
    return {"reply": parts.answer, "thinking": parts.thinking,
            "thinking_tokens": stats.get("thinking_tokens", 0),
            "answer_tokens": stats.get("answer_tokens", done.stats.generated_tokens)}


def thinking_line(session: ChatSession) -> str:
    """" · think 120 · answer 48 tok" after the stats line, for a reply that had thinking; else ""."""
    from app.chat.prompt.thinking import thinking_counts_text

    stats = session.messages[-1].stats if session.messages else None
    if not stats or "thinking_tokens" not in stats:
        return ""
    return " · " + thinking_counts_text(stats["thinking_tokens"], stats.get("answer_tokens", 0))


def open_session(args: argparse.Namespace, engine: Backend, storage: Storage,
                 saved: SavedConversation | None) -> ChatSession:
    """A new saved conversation, or `saved` (the one named by --conversation, whose turn this process
    holds). Sampling flags apply to this reply only: a conversation's settings change when the user
    changes them (the chat's settings screen, or `--save-settings` here)."""
    from app.chat.backend_loader import chat_session
    from app.chat.saved.conversation import SavedConversation

    config, limits = args.config, reply_limits(args.config)
    keep = given_settings(args) if args.save_settings else {}
    if saved is None:
        system = config.system if args.system is None else args.system  # part of the history from now on
        params = sampling_params(args, None, config)
        return chat_session(engine, system, params,
                            SavedConversation.new(storage, engine, system, params, settings=keep), limits)
    params = sampling_params(args, saved.conversation.params, config)
    system = saved.conversation.system if args.system is None else args.system
    if args.save_settings and (keep or system != saved.conversation.system):
        saved.update_settings(system=system, params={**saved.conversation.params, **keep})
    return chat_session(engine, system, params, saved, limits)


def check_before_loading(args: argparse.Namespace) -> str:
    """The message, once every mistake the user can make is ruled out: the flags, the text, an unknown
    --conversation. Nothing heavy is imported yet, so a mistake is reported in a few ms, not after
    torch (about a second) and the model (seconds) have loaded."""
    message = read_message(args.message)
    args.system = clean_input(args.system, "The system prompt")
    sampling_params(args)
    if getattr(args, "raw", False):
        check_raw_flags(args)
    check_tool_flags(args)
    check_length_before_loading(args, message)
    resolve_conversation(args)
    return message


def check_length_before_loading(args: argparse.Namespace, message: str) -> None:
    """Refuse a message no context window of this model could hold (a 793,540-character paste against
    8,192 tokens) before the model loads: the window is read from the model's files (a GGUF header, a
    config.json) in a few ms. Where that is not known (a remote server, a synthetic shape), the chat
    session's same check runs once the model is there."""
    from app.chat.errors import ChatError
    from app.chat.message_length import message_too_long
    from engine.weights.model_window import context_window_before_loading

    if getattr(args, "remote", None) is not None:
        return
    too_long = message_too_long(len(message), context_window_before_loading(args.model) or 0)
    if too_long:
        raise ChatError(too_long)


def resolve_conversation(args: argparse.Namespace) -> None:
    """--conversation to a full id, and --continue to the most recent conversation (ValueError or
    StorageError with one sentence), reading the database only."""
    if getattr(args, "continue_last", False):
        if args.conversation is not None:
            raise ValueError("give --conversation ID or --continue, not both")
        with ConversationStore.open(write=False) as store:
            latest = store.list(limit=1)
        if not latest:
            raise StorageError("There is no saved conversation to continue yet.")
        args.conversation = latest[0].id
    elif args.conversation is not None:
        with ConversationStore.open(write=False) as store:
            args.conversation = store.resolve_id(args.conversation)


def run_ask(args: argparse.Namespace) -> int:
    message = check_before_loading(args)
    if getattr(args, "raw", False):
        return run_raw(args, message)
    from app.cli.options import backend_loader
    from app.chat.saved.conversation import SavedConversation, Storage, reply_stats

    progress = lambda step: print(f"kvchat: {step}…", file=sys.stderr)  # noqa: E731
    storage = Storage.open(args.kv_disk_gb)
    try:
        if storage.conversations.read_only_reason:  # a damaged file, a read-only folder: say so before loading
            raise StorageError(storage.conversations.read_only_reason)
        # An unknown --conversation fails now, not after the model has loaded.
        saved = SavedConversation.open(storage, args.conversation) if args.conversation is not None else None
        engine = backend_loader(args)(args.model, progress if sys.stderr.isatty() else lambda _: None)
        if saved is not None:  # one turn at a time: wait for another kvchat's reply, then read what it added
            saved.begin_turn(TURN_WAIT_S, on_wait=lambda: say("waiting for the reply another kvchat is writing "
                                                              "in this conversation…"), reload=True)
        session = open_session(args, engine, storage, saved)  # discarded stored K/V were logged to stderr
        overflow = OverflowWay(args)  # --drop-oldest / --compact, for a conversation that outgrew the window
        if session.format_notice:  # a model without a chat template: never a silent guess
            say(session.format_notice)
        session.prompt.response_format = args.response_format  # --json-schema
        tools = open_tools(args, engine, session)  # --mcp: the tool loop, or None
        try:
            done, code = _answer(session, message, stream=not args.json, send=overflow.send,
                                 show_thinking=args.show_thinking, tools=tools)
        finally:
            if tools is not None:
                tools.close()
        if tools is not None and tools.report.refused and code == 0:
            code = 1
        try:
            if args.json:
                result = {**result_json(done, engine, session.saved.id, session.chat_format_name),
                          "context_overflow": overflow.taken, **thinking_json(session, done),
                          **(tools.report.json() if tools is not None else {})}
                print(json.dumps(result, ensure_ascii=False), flush=True)
        except BrokenPipeError:
            silence(sys.stdout)
            code = code or BROKEN_PIPE_EXIT
        say(stats_line(reply_stats(done)) + thinking_line(session), prefix=False)
        taken = overflow.report(done.stats)  # what was dropped or compacted, and what it cost
        if taken:
            say(taken)
        say(f"conversation {session.saved.id} (continue it with --conversation {session.saved.id})")
        return code
    finally:
        storage.close()  # waits for the K/V blocks, so the next `ask --conversation` resumes from it


def run_raw(args: argparse.Namespace, message: str) -> int:
    """`ask --raw`: the text as is, continued by the embedded model (app/cli/ask_raw.py); nothing is saved."""
    from app.cli.options import backend_loader
    from app.chat.saved.conversation import reply_stats

    progress = (lambda step: print(f"kvchat: {step}…", file=sys.stderr)) if sys.stderr.isatty() else (lambda _: None)
    engine = backend_loader(args)(args.model, progress)
    params = reply_limits(args.config).apply(sampling_params(args, None, args.config))
    done, code = _answer(RawCompletion(engine, params), message, stream=not args.json)
    try:
        if args.json:
            print(json.dumps({**result_json(done, engine, None), "raw": True}, ensure_ascii=False), flush=True)
    except BrokenPipeError:
        silence(sys.stdout)
        code = code or BROKEN_PIPE_EXIT
    say(stats_line(reply_stats(done)), prefix=False)
    return code


def _answer(session: ChatSession | RawCompletion, message: str, stream: bool, send=None,
            show_thinking: bool = False, tools=None) -> tuple[Done, int]:
    """Send the message (through `send(session, message)`, default session.send) and stream the reply;
    returns its Done and the exit code. A stop signal or a reader that went away stops the reply (kept, as
    stopped); a second signal quits. A reasoning model's thinking is left out of what is streamed unless
    `show_thinking` (then it is printed as the model wrote it, its opening tag included where the prompt
    held it). `tools` (ask_tools.AskTools): the message's tool loop, its calls listed on stderr and each
    round's call markup left out of what is streamed."""
    from app.chat.prompt.thinking import THINK_OPEN, ThinkingSplitter
    from engine import Done, EngineError, TokenDelta

    signals: list[int] = []
    out = SafeOutput(sys.stdout)
    # Control characters in a reply would reach the terminal as commands; a pipe gets the exact text.
    to_terminal = stream and sys.stdout.isatty()

    def on_signal(signum, frame) -> None:
        signals.append(signum)
        if len(signals) > 1:
            raise KeyboardInterrupt
        (tools.loop if tools is not None else session).cancel()  # Done("stopped") before the next token
        say("stopping…")

    def write(text: str) -> None:
        if text and not out.broken and not out.write(printable(text) if to_terminal else text):
            session.cancel()  # nobody reads the reply any more: stop it, keep what was made

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    done = None
    try:
        if tools is not None:
            tools.loop.offer()  # before the prompt is made: the tools are part of it
        events = session.send(message) if send is None else send(session, message)
        if tools is not None:
            events = tools.loop.run(events)
        opens_thinking = getattr(session, "opens_thinking", False)  # set by send; --raw has none
        answer = ThinkingSplitter(opens_thinking)
        if stream and show_thinking and opens_thinking:
            write(THINK_OPEN + "\n")
        for event in events:
            match event:
                case TokenDelta(text=text) if stream:
                    text = text if tools is None else tools.shown(event)
                    write(text if show_thinking else answer.push(text).answer)
                case Done():
                    done = event
                    if tools is not None:
                        tools.report.round_done(event.stats)
                        if stream:
                            write(tools.flush())
                case _ if tools is not None:
                    tools.take(event)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if done is None:
        raise EngineError("The reply ended without a result.")
    if stream:
        if not show_thinking:
            write(answer.flush().answer)
            if answer.in_thinking:  # else the user sees an empty reply and no reason for it
                say("the reply ended while the model was still thinking; --show-thinking prints its reasoning")
        out.write("\n")
    if signals:
        return done, 128 + signals[0]
    if out.broken:
        return done, BROKEN_PIPE_EXIT
    return done, 130 if done.finish_reason == "stopped" else 0
