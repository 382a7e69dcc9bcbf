"""MCP servers in config.toml ([mcp], [mcp.servers.NAME]) and in the mcpServers JSON file other apps keep
(mcp_config): what they become, how the two merge, and the one sentence each mistake gets."""

import json
from pathlib import Path

import pytest

from app.chat.config import ConfigError, load_config
from app.tools.mcp.server_entry import HttpServer, StdioServer
from app.tools.mcp.settings import DEFAULT_MAX_ROUNDS, DEFAULT_RESULT_TOKENS


def config_with(tmp_path: Path, toml: str, mcp_json: dict | str | None = None):
    if mcp_json is not None:
        (tmp_path / "mcp.json").write_text(mcp_json if isinstance(mcp_json, str) else json.dumps(mcp_json))
    path = tmp_path / "config.toml"
    path.write_text(toml)
    return load_config(path)


def refusal(tmp_path: Path, toml: str, mcp_json: dict | str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        config_with(tmp_path, toml, mcp_json)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_no_mcp_settings_mean_no_servers_and_the_defaults(tmp_path):
    mcp = config_with(tmp_path, "").mcp
    assert mcp.servers == {} and mcp.allow == ()
    assert (mcp.max_rounds, mcp.result_tokens) == (DEFAULT_MAX_ROUNDS, DEFAULT_RESULT_TOKENS)


def test_a_stdio_and_an_http_server_from_config_toml(tmp_path):
    mcp = config_with(tmp_path, """
[mcp]
allow = ["time.*", "git.git_status"]
max_rounds = 4
result_tokens = 500
[mcp.servers.git]
command = "mcp-server-git"
args = ["--repository", "."]
env = { GIT_PAGER = "cat" }
cwd = "repos"
timeout = 12.5
[mcp.servers.search]
url = "https://example.org/mcp"
headers = { Authorization = "Bearer x" }
""").mcp
    assert mcp.servers["git"] == StdioServer("mcp-server-git", ("--repository", "."), {"GIT_PAGER": "cat"},
                                             tmp_path / "repos", 12.5)
    assert mcp.servers["git"].env == {"GIT_PAGER": "cat"}
    assert mcp.servers["search"] == HttpServer("https://example.org/mcp", {"Authorization": "Bearer x"})
    assert (mcp.max_rounds, mcp.result_tokens) == (4, 500)


def test_the_allow_list_matches_globs_on_server_dot_tool(tmp_path):
    mcp = config_with(tmp_path, '[mcp]\nallow = ["time.*", "git.git_status"]\n').mcp
    assert mcp.allows("time", "convert_time") and mcp.allows("git", "git_status")
    assert not mcp.allows("git", "git_commit") and not mcp.allows("timer", "x")


def test_servers_of_the_shared_json_file_merge_with_config_tomls_which_win(tmp_path):
    mcp = config_with(tmp_path, """
mcp_config = "mcp.json"
[mcp.servers.time]
command = "my-time"
[mcp.servers.old]
disabled = true
command = "x"
""", {"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"]},
        "fetch": {"command": "uvx", "args": ["mcp-server-fetch"], "env": {"A": "1"}, "autoApprove": ["fetch"]},
        "docs": {"type": "http", "url": "http://127.0.0.1:9/mcp"},
        "off": {"command": "y", "disabled": True},
        "old": {"command": "z"}}}).mcp
    assert list(mcp.servers) == ["time", "fetch", "docs"]
    assert mcp.servers["time"] == StdioServer("my-time")
    assert mcp.servers["fetch"] == StdioServer("uvx", ("mcp-server-fetch",), {"A": "1"})
    assert mcp.servers["docs"] == HttpServer("http://127.0.0.1:9/mcp")


@pytest.mark.parametrize("toml, named", [
    ('[mcp]\nallow = "time.*"\n', "mcp.allow must be a list"),
    ("[mcp]\nmax_rounds = 0\n", "mcp.max_rounds must be a whole number from 1 to 100"),
    ("[mcp]\nresult_tokens = true\n", "mcp.result_tokens must be a whole number"),
    ("[mcp]\nrounds = 3\n", "mcp.rounds is not an MCP setting"),
    ("mcp = 3\n", "[mcp] must be a table"),
    ("[mcp.servers.git]\nargs = []\n", "mcp.servers.git needs a command"),
    ('[mcp.servers.git]\ncommand = "g"\nurl = "http://x"\n', "mcp.servers.git has both command and url"),
    ('[mcp.servers.git]\ncommand = 3\n', "mcp.servers.git.command must be the program to run"),
    ('[mcp.servers.git]\ncommand = "g"\nargs = ["a", 1]\n', "mcp.servers.git.args must be a list of strings"),
    ('[mcp.servers.git]\ncommand = "g"\nenv = { A = 1 }\n', "mcp.servers.git.env must be a table of strings"),
    ('[mcp.servers.git]\ncommand = "g"\ntimeout = 0\n', "mcp.servers.git.timeout must be a number of seconds"),
    ('[mcp.servers.git]\ncommand = "g"\nheaders = {}\n', "mcp.servers.git.headers is for a url"),
    ('[mcp.servers.web]\nurl = "ftp://x"\n', "mcp.servers.web.url must be an http:// or https:// URL"),
    ('[mcp.servers.web]\nurl = "http://x"\nargs = []\n', "mcp.servers.web.args is for a command"),
    ('[mcp.servers.git]\ncommand = "g"\nautoApprove = []\n', "mcp.servers.git.autoApprove is not a server setting"),
    ('[mcp.servers."a.b"]\ncommand = "g"\n', "mcp.servers.a.b is not a usable server name"),
    ('[mcp.servers.a__b]\ncommand = "g"\n', "mcp.servers.a__b is not a usable server name"),
    ('mcp_config = 3\n', "mcp_config must be the path of a JSON file"),
])
def test_each_mistake_in_config_toml_is_one_sentence_naming_the_file_and_the_key(tmp_path, toml, named):
    message = refusal(tmp_path, toml)
    assert named in message and str(tmp_path / "config.toml") in message


@pytest.mark.parametrize("document, named", [
    ("{not json", "is not valid JSON"),
    ({"mcpServers": []}, "mcpServers must be an object of servers"),
    ({"mcpServers": {"x": {"args": []}}}, "mcpServers.x needs a command"),
    ({"mcpServers": {"x": "uvx"}}, "mcpServers.x must be a table of settings"),
    ({"mcpServers": {"x": {"command": "c", "env": {"A": 1}}}}, "mcpServers.x.env must be a table of strings"),
    ({"mcpServers": {"x": {"type": "sse", "url": "http://h/sse"}}}, "mcpServers.x.type = 'sse' is not supported"),
    ({"mcpServers": {"My Server": {"command": "c"}}}, "mcpServers.My Server is not a usable server name"),
])
def test_each_mistake_in_the_shared_json_file_names_that_file_and_the_key(tmp_path, document, named):
    message = refusal(tmp_path, 'mcp_config = "mcp.json"\n', document)
    assert named in message and str(tmp_path / "mcp.json") in message


def test_a_missing_shared_json_file_is_named_with_the_setting_that_named_it(tmp_path):
    message = refusal(tmp_path, 'mcp_config = "nowhere.json"\n')
    assert str(tmp_path / "nowhere.json") in message and "mcp_config" in message and "cannot be read" in message
