"""Whether a tool call may run: nothing runs without the user's yes unless the config's allow-list names it
(`[mcp] allow = ["time.*", "git.git_status"]`: globs over "server.tool", or a bare tool name), or the user
said "always" for that tool in this conversation. The question itself is the caller's (a dialog in the chat,
`--yes` or an error in `kvchat ask`); the answers it may give are Approval's."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from enum import Enum

from app.tools.spec import ToolCall, ToolSpec


class Approval(Enum):
    ONCE = "once"  # run this call
    ALWAYS = "always"  # run this call, and this tool's next calls in this conversation without asking
    NO = "no"  # do not run it: the model is told the user declined


def qualified_name(tool: ToolSpec | None, call: ToolCall) -> str:
    """"server.tool" for an MCP server's tool (its own name: a name the model is offered as "server__tool",
    because two servers have it, loses that prefix), the bare name for a tool the caller runs itself."""
    if tool is None or not tool.server:
        return call.name
    return f"{tool.server}.{call.name.removeprefix(tool.server + '__')}"


class ApprovalPolicy:
    """One conversation's answers so far, over the config's allow-list."""

    def __init__(self, allow: Iterable[str] = (), ask: Callable[[ToolCall, ToolSpec | None], Approval] | None = None):
        """`allow`: the allow-list's globs. `ask`: puts the question to the user (blocking until answered);
        None: nobody can be asked (`kvchat ask` without --yes), so a call not allowed is refused."""
        self.allow = tuple(allow)
        self.ask = ask
        self.always: set[str] = set()  # tools the user said "always" to, by qualified name

    def allowed(self, tool: ToolSpec | None, call: ToolCall) -> bool:
        """Whether `call` runs without a question."""
        name = qualified_name(tool, call)
        return name in self.always or any(fnmatch.fnmatchcase(name, pattern) or fnmatchcase_bare(call.name, pattern)
                                          for pattern in self.allow)

    def decide(self, tool: ToolSpec | None, call: ToolCall) -> bool:
        """Whether `call` may run now: allowed, or the user said yes (once or always)."""
        if self.allowed(tool, call):
            return True
        if self.ask is None:
            return False
        answer = self.ask(call, tool)
        if answer is Approval.ALWAYS:
            self.always.add(qualified_name(tool, call))
        return answer is not Approval.NO


def fnmatchcase_bare(name: str, pattern: str) -> bool:
    """A pattern without a server part ("get_time") names a tool of any server by its own name."""
    return "." not in pattern and fnmatch.fnmatchcase(name, pattern)
