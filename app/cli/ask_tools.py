"""`kvchat ask`'s tools: `--mcp NAME` (repeatable) offers that configured MCP server's tools and runs the
tool loop without a person at the keyboard, `--tool-choice` says how the model must use them (as OpenAI's
API: auto, none, required, or a tool's name), `--yes` lets every call run (else only the config's allow-list
does: a call that needs approval ends the command with one sentence, exit 1, its reply kept), and
`--json-schema FILE` holds the reply to a JSON schema (constrained decoding; with --remote, the server's
response_format). Calls are listed on stderr as they run; `--json` adds `tool_calls` and `rounds`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from app.chat.terminal_text import printable, say
from app.tools.events import ToolCallFinished, ToolCallStarted, ToolLoopEnded, ToolRound
from app.tools.toolbox import CHOICES, ToolChoice

if TYPE_CHECKING:
    from app.chat.session import ChatSession
    from app.chat.tool_loop import ToolLoop

MAX_SCHEMA_BYTES = 1 << 20  # a schema is a few kilobytes; a megabyte is a wrong file


def add_tool_options(ask: argparse.ArgumentParser) -> None:
    ask.add_argument("--mcp", metavar="NAME", action="append", default=[],
                     help="offer the tools of this MCP server of the config file (repeatable) and run the tool loop")
    ask.add_argument("--tool-choice", metavar="CHOICE", default="auto",
                     help="auto (the model decides), none, required (at least one call), or a tool's name")
    ask.add_argument("--yes", action="store_true",
                     help="run every tool call without asking (else only the config's [mcp] allow-list runs)")
    ask.add_argument("--json-schema", metavar="FILE", default=None,
                     help="the reply is one JSON value following this JSON schema (constrained decoding)")


def check_tool_flags(args: argparse.Namespace) -> None:
    """ValueError (one sentence) for tool flags that cannot work, before anything loads; reads --json-schema
    into args.response_format."""
    args.response_format = None
    if args.json_schema is not None:
        args.response_format = {"type": "json_schema", "json_schema": {"name": "reply",
                                                                       "schema": read_schema(Path(args.json_schema))}}
    if args.tool_choice != "auto" and not args.mcp:
        raise ValueError("--tool-choice goes with --mcp NAME (the tools to choose from)")
    if args.yes and not args.mcp:
        raise ValueError("--yes goes with --mcp NAME (the tools it lets run)")
    if args.mcp and args.json_schema is not None:
        raise ValueError("--json-schema and --mcp do not go together: a reply is either a JSON value or tool calls")
    if args.mcp and getattr(args, "raw", False):
        raise ValueError("--mcp needs a chat template; --raw sends the text as is")
    servers = args.config.mcp.servers
    for name in args.mcp:
        if name not in servers:
            known = ", ".join(servers) or "none: add [mcp.servers.NAME] to the config file"
            raise ValueError(f"there is no MCP server named {name!r} in the config (known: {known})")


def check_tool_choice(choice: ToolChoice, names: list[str]) -> None:
    """A named --tool-choice must be one of the offered tools (known once the servers have listed them)."""
    if choice.named is not None and choice.named not in names:
        raise ValueError(f"--tool-choice {choice.named!r} is neither {', '.join(CHOICES)} nor one of the tools "
                         f"offered ({', '.join(names) or 'none'})")


def read_schema(path: Path) -> dict:
    """The JSON schema in `path`; ValueError with one sentence if it is not a readable, valid one."""
    import jsonschema

    try:
        if path.stat().st_size > MAX_SCHEMA_BYTES:
            raise ValueError(f"{path} is over {MAX_SCHEMA_BYTES >> 20} MB, which is not a JSON schema")
        schema = json.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise ValueError(f"cannot read the JSON schema {path} ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{path} is not a JSON schema (a JSON object)")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{path} is not a valid JSON schema: {exc.message}") from None
    return schema


class ToolReport:
    """What `ask` says of the loop: each call on stderr as it runs, and the `--json` fields."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.calls: list[dict] = []
        self.rounds: list[dict] = []
        self.refused: list[str] = []  # calls that needed an approval nobody could give
        self.ended: str | None = None

    def take(self, event) -> None:
        """A tool event of the loop (any other event is not this report's)."""
        match event:
            case ToolRound():
                pass
            case ToolCallStarted(call=call, approved=approved):
                arguments = json.dumps(call.arguments, ensure_ascii=False)
                if not approved:
                    self.refused.append(call.name)
                if not self.quiet:
                    say(f"tool {call.name} {printable(arguments)}" + ("" if approved else " (not run)"))
            case ToolCallFinished(result=result):
                call = result.call
                self.calls.append({"name": call.name, "arguments": call.arguments, "result": result.text,
                                   "ms": round(result.ms, 1), "is_error": result.is_error})
                if not self.quiet and (result.is_error or result.truncated):
                    say(f"tool {call.name}: {printable(result.text.splitlines()[0] if result.text else '')}")
            case ToolLoopEnded(reason=reason):
                self.ended = reason
                if not self.refused:  # a refusal has said why already
                    say(reason)

    def round_done(self, stats) -> None:
        self.rounds.append({"prompt_tokens": stats.prompt_tokens, "cached_tokens": stats.cached_tokens,
                            "prefilled_tokens": stats.prefilled_tokens, "ttft_ms": round(stats.ttft_ms, 1)})

    def json(self) -> dict:
        return {"tool_calls": self.calls, "rounds": self.rounds}


class AskTools:
    """One `ask`'s tool loop: the MCP servers it started, what is streamed of each round (its call markup left
    out), and the report."""

    def __init__(self, loop: ToolLoop, report: ToolReport, hub, session: ChatSession):
        self.loop, self.report, self.hub, self.session = loop, report, hub, session
        self.parser = None  # the round's reply, read as it streams (an embedded model's token ids)

    def take(self, event) -> None:
        if isinstance(event, ToolRound):
            self.parser = self.session.tools.call_reader()
        self.report.take(event)

    def shown(self, event) -> str:
        """What a TokenDelta adds to the streamed reply: its text, less any call markup (a server parses the
        calls itself and streams none)."""
        if self.parser is None or event.token_id is None:
            return event.text if self.parser is None else ""
        return self.parser.feed_token(event.token_id)

    def flush(self) -> str:
        """The round's reply ended: the text its parser held back (a marker's start that was not one)."""
        if self.parser is None:
            return ""
        text, self.parser = self.parser.flush(), None
        return text

    def close(self) -> None:
        self.hub.close()


def open_tools(args: argparse.Namespace, engine, session: ChatSession) -> AskTools | None:
    """The tool loop `--mcp` asks for (None without it): the servers started, their tools listed (a server
    that fails is one sentence on stderr; none listing any tool is a ValueError), calls allowed by --yes or
    the config's allow-list (any other ends the loop: ask has nobody to ask)."""
    if not args.mcp:
        return None
    from app.chat.tool_loop import ToolLoop
    from app.tools.approval import Approval, ApprovalPolicy
    from app.tools.mcp.hub import McpHub
    from app.tools.mcp.toolbox import McpToolBox

    settings = args.config.mcp
    count = (lambda text: len(engine.tokenizer.encode(text))) if session.token_ids else None
    hub = McpHub(settings, count_tokens=count)
    try:
        box = McpToolBox(hub, list(args.mcp))
        names = [tool.name for tool in box.specs()]
        for problem in box.problems():
            say(problem)
        if not names:
            raise ValueError(f"no tool to offer: {', '.join(args.mcp)} listed none")
        choice = ToolChoice(args.tool_choice)
        check_tool_choice(choice, names)
        report = ToolReport(quiet=args.json)
        loop: ToolLoop

        def ask(call, tool) -> Approval:
            if args.yes:
                return Approval.ONCE
            say(f"the model called {tool.server + '.' if tool and tool.server else ''}{call.name}, which needs your "
                "approval: add --yes to run the tools it calls, or allow it in the config ([mcp] allow)")
            loop.stopped.set()  # nobody to ask: no call after this one, no round after its reply
            return Approval.NO

        loop = ToolLoop(session, box, ApprovalPolicy(settings.allow, ask), settings.max_rounds, choice)
        if session.prompt.tool_format_notice:  # never a silent guess, as for chat formats
            say(session.prompt.tool_format_notice)
        return AskTools(loop, report, hub, session)
    except BaseException:
        hub.close()
        raise
