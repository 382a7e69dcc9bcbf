"""McpHub with real MCP servers, as users install them: mcp-server-time and mcp-server-git (over a git
repository made here), both started once for the module, together."""

import subprocess
import sys

import pytest

from app.tools.mcp.hub import McpHub
from app.tools.mcp.server_entry import StdioServer
from app.tools.mcp.settings import McpSettings
from app.tools.spec import ToolCall


pytestmark = pytest.mark.xdist_group("mcp-real-servers")  # one xdist worker starts the server(s) (--dist loadgroup)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    git = ["git", "-C", str(repo), "-c", "user.name=Test", "-c", "user.email=test@example.org"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "notes.txt").write_text("first\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "Add the notes"], check=True)
    (repo / "draft.txt").write_text("not added yet\n")
    return repo


@pytest.fixture(scope="module")
def hub(tmp_path_factory, repository):
    settings = McpSettings({
        "time": StdioServer(sys.executable, ("-m", "mcp_server_time", "--local-timezone", "UTC")),
        "git": StdioServer(sys.executable, ("-m", "mcp_server_git", "--repository", str(repository))),
    }, allow=("time.*", "git.git_status"))
    with McpHub(settings, log_dir=tmp_path_factory.mktemp("mcp-logs")) as hub:
        yield hub


def test_both_servers_list_their_tools_under_their_own_names(hub):
    specs = {spec.name: spec for spec in hub.tools()}
    assert {"get_current_time", "convert_time", "git_status", "git_log"} <= set(specs)
    assert specs["convert_time"].server == "time" and specs["git_log"].server == "git"
    assert specs["convert_time"].parameters["required"] == ["source_timezone", "time", "target_timezone"]
    assert {name: status.state for name, status in hub.status().items()} == {"time": "ready", "git": "ready"}


def test_a_listing_of_one_server_offers_only_its_tools(hub):
    assert {spec.server for spec in hub.tools(["time"])} == {"time"}


def test_convert_time_answers_with_the_converted_time(hub):
    result = hub.call(ToolCall("convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                "target_timezone": "Asia/Tokyo"}))
    assert not result.is_error and not result.truncated
    assert '"datetime": "' in result.text and "T21:00:00+09:00" in result.text  # Tokyo keeps no DST
    assert '"time_difference": "+9.0h"' in result.text


def test_a_tools_own_error_is_an_error_result(hub):
    result = hub.call(ToolCall("get_current_time", {"timezone": "Nowhere/Special"}))
    assert result.is_error and "Nowhere/Special" in result.text


def test_git_status_and_log_read_the_repository(hub, repository):
    status = hub.call(ToolCall("git_status", {"repo_path": str(repository)}))
    assert not status.is_error and "On branch main" in status.text and "draft.txt" in status.text
    log = hub.call(ToolCall("git_log", {"repo_path": str(repository), "max_count": 5}))
    assert not log.is_error and "Add the notes" in log.text


def test_the_allow_list_decides_which_calls_run_without_asking(hub):
    hub.tools()
    assert hub.runs_without_asking(ToolCall("convert_time", {}))
    assert hub.runs_without_asking(ToolCall("git_status", {}))
    assert not hub.runs_without_asking(ToolCall("git_commit", {}))
    assert not hub.runs_without_asking(ToolCall("no_such_tool", {}))
