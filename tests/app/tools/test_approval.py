"""Whether a call may run: the allow-list's globs, "always" for a tool in this conversation, and no one to ask."""

from app.tools.approval import Approval, ApprovalPolicy
from app.tools.spec import ToolCall, ToolSpec

GIT_STATUS = ToolSpec("git_status", "", {}, server="git")
CLASHING = ToolSpec("git__status", "", {}, server="git")  # offered as server__tool: two servers have "status"


def test_always_asks_once_per_tool_and_once_asks_every_time():
    asked = []
    policy = ApprovalPolicy(ask=lambda call, tool: asked.append(call.arguments["n"]) or Approval.ALWAYS)
    assert policy.decide(GIT_STATUS, ToolCall("git_status", {"n": 1}))
    assert policy.decide(GIT_STATUS, ToolCall("git_status", {"n": 2}))
    assert asked == [1]
    once = ApprovalPolicy(ask=lambda call, tool: asked.append(call.arguments["n"]) or Approval.ONCE)
    assert once.decide(GIT_STATUS, ToolCall("git_status", {"n": 3})) and once.decide(GIT_STATUS, ToolCall("git_status", {"n": 4}))
    assert asked == [1, 3, 4]


def test_no_is_refused_and_nobody_to_ask_refuses_what_the_list_does_not_allow():
    assert not ApprovalPolicy(ask=lambda call, tool: Approval.NO).decide(GIT_STATUS, ToolCall("git_status", {}))
    assert not ApprovalPolicy().decide(GIT_STATUS, ToolCall("git_status", {}))


def test_the_allow_list_names_server_dot_tool_globs_or_bare_tool_names():
    call = ToolCall("git_status", {})
    assert ApprovalPolicy(allow=["git.*"]).allowed(GIT_STATUS, call)
    assert ApprovalPolicy(allow=["git_status"]).allowed(GIT_STATUS, call)
    assert not ApprovalPolicy(allow=["time.*", "git.git_log"]).allowed(GIT_STATUS, call)
    # A tool offered as "git__status" is still git's "status" to the allow-list.
    assert ApprovalPolicy(allow=["git.status"]).allowed(CLASHING, ToolCall("git__status", {}))
