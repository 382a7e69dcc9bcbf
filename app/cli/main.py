"""The `kvchat` command: the TUI (no arguments), `ask`, `serve`, `bench`, `models`, and the saved-conversation
commands.

User mistakes end with one sentence on stderr and a non-zero exit code:
1 for a problem with the model or the request, 2 for bad arguments,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from app.cli.ask_tools import add_tool_options
from app.cli.arg_types import (MAX_BATCH, MAX_DRAFT_TOKENS, batch_size, draft_tokens, non_negative_float, port,
                               positive_float, positive_int)

# Quiet, offline Hugging Face libraries before anything imports them.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _engine_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # Given before or after the subcommand; a subcommand must not reset what the top level parsed.
    default = (lambda value: value) if top_level else (lambda value: argparse.SUPPRESS)
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=default(None),
                       help="model directory, .gguf file, ollama:NAME[:TAG] (a model ollama keeps), local Hugging "
                            "Face id, or synthetic:NAME (a known shape with random weights; default: $KVCHAT_MODEL, "
                            "else the bundled SmolLM2-135M-Instruct); `kvchat models` lists those found")
    group.add_argument("--device", default=default("auto"), choices=["auto", "cpu", "cuda"])
    group.add_argument("--dtype", default=default("auto"), choices=["auto", "float32", "bfloat16", "float16"],
                       help="auto: bfloat16 on CUDA, float32 on CPU (exact)")
    group.add_argument("--threads", type=positive_int, default=default(None),
                       help="CPU threads (default: torch's choice)")
    group.add_argument("--kv-cache-gb", type=positive_float, default=default(None),
                       help="memory for cached K/V (default: 80%% of free GPU memory, or min(2, RAM/4) GiB on a CPU)")
    group.add_argument("--exact-fp32", action=argparse.BooleanOptionalAction, default=default(None),
                       help="multiply quantized weights in fp32, exactly as transformers does (default: int8 "
                            "activations times the blocks in integers, faster; exact_fp32 = true in the config "
                            "file turns this on). With --remote the server's own flag decides")
    group.add_argument("--no-prefix-cache", action="store_true", default=default(False),
                       help="compute every prompt in full (for baselines and checks)")
    # The decode path (engine/decode/path.py); unset: the measured default for the device.
    group.add_argument("--paged-kv", action=argparse.BooleanOptionalAction, default=default(None),
                       help="attention reads KV blocks in place (default: on with CUDA, off on a CPU)")
    group.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=default(None),
                       help="replay the decode step from CUDA graphs (default: on with CUDA)")
    group.add_argument("--compile", action=argparse.BooleanOptionalAction, default=default(None),
                       help="torch.compile the decode step (default: off; slow first start)")
    group.add_argument("--fused-decode", action=argparse.BooleanOptionalAction, default=default(None),
                       help="run a CPU decode step as one C call (default: on for fp32 on a CPU; "
                            "--no-fused-decode: the eager PyTorch step)")
    # Speculative decoding (engine/request/speculation.py); unset: the engine's defaults (ngram, 8).
    group.add_argument("--speculative", choices=["ngram", "off"], default=default(None),
                       help="ngram: draft tokens looked up in the conversation itself and verified in one "
                            "forward; greedy output is token for token the same (default). off: one token per step")
    group.add_argument("--draft-tokens", metavar="K", type=draft_tokens, default=default(None),
                       help=f"the most draft tokens one step verifies, 1 to {MAX_DRAFT_TOKENS} (default: 8); "
                            "the engine drafts fewer, or none, while drafts keep failing")
    group.add_argument("--max-batch", metavar="N", type=batch_size, default=default(None),
                       help=f"the most requests decoded together, 1 to {MAX_BATCH} (default: 8): "
                            "kvchat serve's clients, the chat's candidate replies")


def _remote_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    default = None if top_level else argparse.SUPPRESS
    group = parser.add_argument_group("remote server (instead of the embedded engine)")
    group.add_argument("--remote", metavar="URL", default=default,
                       help="chat through an OpenAI-compatible server (vLLM, SGLang, kvchat serve), e.g. "
                            "http://gpu-box:8000/v1; --model then names one of its models (default: its first)")
    group.add_argument("--api-key", dest="remote_api_key", metavar="KEY", default=default,
                       help="the server's API key (default: $KVCHAT_API_KEY, else none)")


def _storage_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    group = parser.add_argument_group("storage")
    group.add_argument("--kv-disk-gb", type=non_negative_float, default=None if top_level else argparse.SUPPRESS,
                       help="disk budget for stored K/V blocks (the block store), in GB; least recently used "
                            "blocks go first; 0: none kept (default: 4)")
    # The flag's name before the block store: still accepted, no longer shown.
    group.add_argument("--snapshot-gb", dest="kv_disk_gb", type=non_negative_float, default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)


def _sampling_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    # Not given: the conversation's saved setting, else SamplingParams' default (shown here). Given
    # before or after the subcommand, like the engine options.
    default = None if top_level else argparse.SUPPRESS
    group = parser.add_argument_group("sampling (default: the conversation's own settings, else these)")
    group.add_argument("--system", default=default,
                       help="system prompt of a new conversation (default: the model's own)")
    group.add_argument("--temperature", type=float, default=default, help="0 = greedy and deterministic (0.7)")
    group.add_argument("--top-p", type=float, default=default, help="(1.0 = off)")
    group.add_argument("--top-k", type=int, default=default, help="(0 = off)")
    group.add_argument("--min-p", type=float, default=default, help="(0 = off)")
    group.add_argument("--repetition-penalty", type=float, default=default, help="(1.0 = off)")
    group.add_argument("--max-tokens", type=int, default=default, help="(until the model stops)")
    group.add_argument("--seed", type=int, default=default)


class Parser(argparse.ArgumentParser):
    """A mistake on the command line is one line, like every other kvchat error (not usage + error)."""

    def error(self, message: str):
        self.exit(2, f"kvchat: {message} (see `{self.prog} --help`).\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvchat", description="Chat with a local LLM in the terminal.")
    _chat_arguments(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    _add_ask(commands)
    _add_library_commands(commands)
    _add_disk_commands(commands)
    _add_models(commands)
    _add_serve(commands)
    _add_bench(commands)
    return parser


def _chat_arguments(parser: argparse.ArgumentParser) -> None:
    """The top level's own: the chat app's (no command), and the shared groups' defaults for every command."""
    _engine_options(parser, top_level=True)
    _remote_options(parser, top_level=True)
    _storage_options(parser, top_level=True)
    parser.add_argument("--version", action="version", version=f"kvchat {_version()}")
    parser.add_argument("--conversation", metavar="ID", help="open this saved conversation (id or unique prefix)")
    parser.add_argument("-c", "--continue", dest="continue_last", action="store_true",
                        help="open the most recent conversation")
    _sampling_options(parser, top_level=True)


def _add_ask(commands) -> None:
    ask = commands.add_parser("ask", help="answer one message (in a new or a saved conversation) and exit")
    ask.add_argument("message", help="the message; '-' reads it from stdin")
    ask.add_argument("--conversation", metavar="ID", default=argparse.SUPPRESS,
                     help="continue this saved conversation (id or unique prefix)")
    ask.add_argument("-c", "--continue", dest="continue_last", action="store_true", default=argparse.SUPPRESS,
                     help="continue the most recent conversation")
    ask.add_argument("--json", action="store_true", help="print one JSON object instead of the streamed reply")
    overflow = ask.add_mutually_exclusive_group()  # what to do when the conversation outgrew the context window
    overflow.add_argument("--drop-oldest", action="store_true",
                          help="if the conversation with the message does not fit the context window, answer on a "
                               "new branch without its oldest turns (the old branch stays as it is)")
    overflow.add_argument("--compact", action="store_true",
                          help="if it does not fit, the model summarizes the earlier turns and the answer goes on a "
                               "new branch from that summary (the old branch stays as it is)")
    ask.add_argument("--raw", action="store_true",
                     help="send the text as is, without a chat template (a base model's completion; not saved)")
    ask.add_argument("--show-thinking", action="store_true",
                     help="a reasoning model's <think> block too (by default only its answer is printed)")
    add_tool_options(ask)
    ask.add_argument("--save-settings", action="store_true",
                     help="keep the sampling flags (and --system) as the conversation's settings; without it they "
                          "apply to this reply only")
    _engine_options(ask, top_level=False)
    _remote_options(ask, top_level=False)
    _storage_options(ask, top_level=False)
    _sampling_options(ask, top_level=False)


def _add_library_commands(commands) -> None:
    """The saved conversations' commands (app/cli/conversations.py): no model is loaded."""
    listing = commands.add_parser("list", help="saved conversations, newest first")
    listing.add_argument("--limit", type=positive_int, default=None)
    listing.add_argument("--json", action="store_true", help="print one JSON array")
    listing.add_argument("--deleted", action="store_true", help="the trash instead (kept 30 days; see restore)")
    show = commands.add_parser("show", help="print a saved conversation")
    show.add_argument("id", help="conversation id or unique prefix")
    export = commands.add_parser("export", help="write a saved conversation as Markdown or JSON")
    export.add_argument("id", help="conversation id or unique prefix")
    export.add_argument("--format", choices=["md", "json"], default="md")
    export.add_argument("--output", "-o", metavar="FILE", help="default (or -): stdout; an existing file is "
                        "refused unless --force, a symlink always")
    export.add_argument("--force", action="store_true", help="replace FILE if it exists")
    delete = commands.add_parser("delete", help="move a saved conversation (and its K/V on disk) to the trash")
    delete.add_argument("id", help="conversation id or unique prefix")
    delete.add_argument("--permanently", action="store_true", help="delete it for good instead, at once")
    restore = commands.add_parser("restore", help="bring a conversation back from the trash")
    restore.add_argument("id", help="conversation id or unique prefix (see `kvchat list --deleted`)")
    search = commands.add_parser("search", help="find messages containing every word of TEXT")
    search.add_argument("text")
    search.add_argument("--limit", type=positive_int, default=50)
    search.add_argument("--json", action="store_true", help="print one JSON array")
    rename = commands.add_parser("rename", help="give a saved conversation a new title")
    rename.add_argument("id", help="conversation id or unique prefix")
    rename.add_argument("title")
    for sub in (listing, show, export, delete, restore, search, rename):
        _storage_options(sub, top_level=False)


def _add_disk_commands(commands) -> None:
    """What kvchat keeps on disk (`storage`) and the conversation database's care (`db`)."""
    storage = commands.add_parser("storage", help="what kvchat keeps on disk, how big it is, and how to free space")
    storage.add_argument("--json", action="store_true", help="print one JSON object")
    _storage_options(storage, top_level=False)
    db = commands.add_parser("db", help="check, back up, restore or recover the conversation database")
    db.add_argument("action", choices=["check", "backup", "restore", "recover"],
                    help="check: verify it; backup [FILE]: copy it now (default: the backups folder); "
                         "restore [FILE]: put a backup in its place (default: the newest), the current file "
                         "moved aside; recover: salvage what a damaged file still holds into a new database")
    db.add_argument("file", nargs="?", metavar="FILE", help="the backup to write or to restore")


def _add_models(commands) -> None:
    models = commands.add_parser("models", help="the models on this machine (kvchat's, ollama's, LM Studio's, "
                                 "llama.cpp's, the Hugging Face cache's) and whether kvchat runs each")
    models.add_argument("--json", action="store_true", help="print one JSON array")


def _add_serve(commands) -> None:
    serve = commands.add_parser("serve", help="serve the model through an OpenAI-compatible HTTP API")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=port, default=8000, help="(default: 8000)")
    serve.add_argument("--api-key", metavar="KEY", default=None,
                       help="require 'Authorization: Bearer KEY' on every request "
                            "(default: $KVCHAT_API_KEY, else none)")
    serve.add_argument("--allowed-host", metavar="NAME", action="append", default=[],
                       help="also answer requests whose Host header is NAME (repeatable; on 127.0.0.1 only "
                            "its address and localhost are answered, against DNS rebinding)")
    _engine_options(serve, top_level=False)


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="measure prefill and decode against transformers")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--repeat", type=positive_int, default=None,
                       help="runs per measurement (medians are reported; default 5, --synthetic: 3)")
    bench.add_argument("--quick", action="store_true", help="short prompts and few runs (a smoke test)")
    bench.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    bench.add_argument("--ui", action="store_true",
                       help="only the chat app's costs: streaming with and without the UI, opening 500 messages")
    bench.add_argument("--no-ui", action="store_true", help="skip the chat app's costs")
    bench.add_argument("--profile", action="store_true",
                       help="only where a decode step's time goes: quantized matmuls, torch ops, the rest")
    bench.add_argument("--batch", action="store_true",
                       help="only continuous batching: 1-8 requests decoded together next to one at a time")
    bench.add_argument("--speculation", action="store_true",
                       help="only the speculative section: greedy replies with n-gram drafting off and on")
    bench.add_argument("--grammar", action="store_true",
                       help="only constrained decoding: a JSON-schema reply's tok/s next to plain decode, the mask's cost")
    bench.add_argument("--contention", action="store_true",
                       help="only decode next to a competing process (a busy loop, a second kvchat decoding)")
    from app.bench.arithmetic import add_arguments as arithmetic_arguments
    from app.bench.tools import add_arguments as tools_arguments
    from app.bench.serve import add_arguments as serve_arguments
    from app.bench.synthetic import add_arguments as synthetic_arguments

    arithmetic_arguments(bench)
    tools_arguments(bench)
    synthetic_arguments(bench)
    serve_arguments(bench)
    _engine_options(bench, top_level=False)


# Flags of the embedded engine, with their defaults: given with --remote they would be silently ignored.
ENGINE_ONLY = {"device": "auto", "dtype": "auto", "threads": None, "kv_cache_gb": None, "no_prefix_cache": False,
               "paged_kv": None, "cuda_graphs": None, "compile": None, "fused_decode": None, "speculative": None,
               "draft_tokens": None, "max_batch": None, "exact_fp32": None}


def check_backend_args(args: argparse.Namespace) -> None:
    """ValueError (one sentence) for flags that do not go with the chosen backend."""
    remote = getattr(args, "remote", None)
    if remote is None:
        if getattr(args, "remote_api_key", None):
            raise ValueError("--api-key goes with --remote URL (the server's key)")
        return
    if args.command not in (None, "ask"):
        raise ValueError(f"--remote works with the chat app and `kvchat ask`, not with `kvchat {args.command}`")
    for name, default in ENGINE_ONLY.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is a setting of the embedded engine; with --remote the server decides it")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvchat")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def apply_config(args: argparse.Namespace) -> None:
    """The config file's defaults under the flags (app/chat/config.py): args.config, and --model's default."""
    from app.chat.config import load_config

    args.config = load_config()
    if getattr(args, "model", None) is None and not os.environ.get("KVCHAT_MODEL") and args.config.model:
        args.model = args.config.model


def _fail(message: str, code: int = 1) -> int:
    from app.chat.terminal_text import say

    say(message)  # control characters shown as escapes: a message may quote what the user typed
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from app.chat.errors import USER_FACING_ERRORS

    try:
        check_backend_args(args)
        apply_config(args)
        if args.command in ("list", "show", "export", "delete", "restore", "search", "rename"):
            from app.cli.conversations import run_conversation_command

            return run_conversation_command(args)
        if args.command == "storage":
            from app.cli.storage_usage import run_storage

            return run_storage(args)
        if args.command == "models":
            from app.cli.models_list import run_models

            return run_models(args)
        if args.command == "db":
            from app.cli.db import run_db_command

            return run_db_command(args)
        if args.command == "ask":
            from app.cli.ask import run_ask

            return run_ask(args)
        if args.command == "serve":
            from app.server.main import run_serve

            return run_serve(args)
        if args.command == "bench" and args.serve:
            from app.bench.serve import run_serve_bench

            return run_serve_bench(args)
        if args.command == "bench" and (args.arithmetic or args.roofline or args.agreement):
            from app.bench.arithmetic import run_arithmetic_bench

            return run_arithmetic_bench(args)
        if args.command == "bench" and args.synthetic:
            from app.bench.synthetic import run_synthetic_bench

            return run_synthetic_bench(args)
        if args.command == "bench":
            from app.bench.main import run_bench

            args.repeat = 5 if args.repeat is None else args.repeat
            return run_bench(args)
        from app.cli.ask import resolve_conversation
        from app.chat.sampling_settings import sampling_params

        sampling_params(args)  # the chat's flags and --conversation/--continue, before Textual or torch load
        resolve_conversation(args)
        from app.cli.options import backend_loader
        from app.tui.run import run_tui

        return run_tui(args, backend_loader(args))
    except USER_FACING_ERRORS as exc:
        return _fail(str(exc))
    except ValueError as exc:  # invalid sampling parameters and similar argument mistakes
        from app.chat.wording import sentence

        return _fail(sentence(str(exc)), code=2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kvchat list | head`: the reader went away; end as a pipe's writer does
        from app.chat.terminal_text import BROKEN_PIPE_EXIT, silence

        silence(sys.stdout)
        return BROKEN_PIPE_EXIT


def run() -> NoReturn:
    """The `kvchat` command: main() on the command line, then the end of the process (process_end.py)."""
    from app.cli.process_end import end_process

    end_process(main())


if __name__ == "__main__":
    run()
