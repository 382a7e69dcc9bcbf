"""`kvchat ask --mcp NAME`: the tool loop without a person, on the bundled model and a real MCP server
(mcp-server-time, started as users start it); a call runs only with --yes or when allow-listed; calls on
stderr and in --json; `--json-schema FILE` holds the reply to a schema; every mistake is one sentence."""

import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.app.in_process_cli import assert_one_clear_error, kvchat

TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
ASK = ("ask", "What time is it in Tokyo?", "--temperature", "0", "--max-tokens", "60")


def config(tmp_path, allow: str = "") -> dict:
    path = tmp_path / "config.toml"
    path.write_text(f'[mcp]\nallow = [{allow}]\n[mcp.servers.time]\ncommand = "{TIME_SERVER}"\n'
                    'args = ["--local-timezone", "UTC"]\n')
    return {"KVCHAT_CONFIG": str(path)}


@pytest.mark.real_model
def test_with_yes_the_forced_call_runs_on_the_real_server_and_json_lists_calls_and_rounds(tmp_path):
    result = kvchat(*ASK, "--mcp", "time", "--tool-choice", "required", "--yes", "--json", env=config(tmp_path))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    (call, *_) = out["tool_calls"]
    assert call["name"] in ("get_current_time", "convert_time") and isinstance(call["arguments"], dict)
    assert call["result"] and call["ms"] > 0  # the server's answer (or its one-sentence error), timed
    first, second = out["rounds"][:2]
    assert set(first) == {"prompt_tokens", "cached_tokens", "prefilled_tokens", "ttft_ms"}
    assert second["cached_tokens"] >= first["prompt_tokens"]  # the round after the call prefills the result
    assert "Traceback" not in result.stderr


@pytest.mark.real_model
def test_without_yes_a_call_is_not_run_exit_1_with_one_sentence(tmp_path):
    result = kvchat(*ASK, "--mcp", "time", "--tool-choice", "required", "--json", env=config(tmp_path))
    assert result.returncode == 1
    assert "needs your approval: add --yes" in result.stderr and "Traceback" not in result.stderr
    out = json.loads(result.stdout)
    assert "did not allow" in out["tool_calls"][0]["result"] and len(out["rounds"]) == 1


@pytest.mark.real_model
def test_an_allow_listed_tool_runs_without_yes_and_the_calls_are_listed_on_stderr(tmp_path):
    result = kvchat(*ASK, "--mcp", "time", "--tool-choice", "required", env=config(tmp_path, '"time.*"'))
    assert result.returncode == 0, result.stderr
    assert "kvchat: tool get_current_time {" in result.stderr or "kvchat: tool convert_time {" in result.stderr
    assert "<tool_call>" not in result.stdout  # the call's markup is not the reply's text
    assert result.stderr.count("has no tool format") == 1  # the convention is said once, never silently used


@pytest.mark.real_model
def test_json_schema_holds_the_reply_to_the_schema(tmp_path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "rivers": {"type": "array",
              "items": {"type": "string"}, "maxItems": 3}}, "required": ["city", "rivers"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    result = kvchat("ask", "Name a city and its rivers.", "--temperature", "0", "--max-tokens", "80",
                    "--json-schema", str(path), "--json")
    assert result.returncode == 0, result.stderr
    jsonschema.validate(json.loads(json.loads(result.stdout)["reply"]), schema)


@pytest.mark.parametrize("flags, words", [
    (["--mcp", "nope"], "no MCP server named 'nope'"),
    (["--tool-choice", "required"], "--tool-choice goes with --mcp"),
    (["--yes"], "--yes goes with --mcp"),
    (["--json-schema", "missing.json"], "cannot read the JSON schema"),
])
def test_tool_flags_that_cannot_work_are_one_sentence_before_anything_loads(tmp_path, flags, words):
    assert_one_clear_error(kvchat("ask", "hi", *flags, env=config(tmp_path)), 2, words)


def test_a_schema_that_is_not_one_is_one_sentence(tmp_path):
    for text, words in [("[1, 2]", "is not a JSON schema"), ("{nope", "is not JSON"),
                        ('{"type": 12}', "is not a valid JSON schema")]:
        path = tmp_path / "schema.json"
        path.write_text(text)
        assert_one_clear_error(kvchat("ask", "hi", "--json-schema", str(path)), 2, words)


HOSTILE = Path(__file__).parents[1] / "tools" / "mcp" / "hostile_server.py"


@pytest.mark.real_model
@pytest.mark.parametrize("tool", ["paint", "spill"])
def test_nothing_a_hostile_tool_returns_reaches_the_terminal_or_the_database_raw(tmp_path, tool):
    """The model is made to call a tool that answers with terminal escapes (or megabytes): what is stored,
    printed and exported is the tool layer's safe text, cut to its budget."""
    path = tmp_path / "config.toml"
    path.write_text(f'[mcp]\nresult_tokens = 200\n[mcp.servers.hostile]\ncommand = "{sys.executable}"\n'
                    f'args = ["{HOSTILE}"]\n')
    env = {"KVCHAT_CONFIG": str(path)}
    result = kvchat("ask", "Use the tool.", "--temperature", "0", "--max-tokens", "40", "--mcp", "hostile",
                    "--tool-choice", tool, "--yes", "--json", env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    (call, *_) = out["tool_calls"]
    assert call["name"] == tool
    exported = kvchat("export", out["conversation_id"], "--format", "json", env=env).stdout
    stored = [m for m in json.loads(exported)["messages"] if m["role"] == "tool"][0]["text"]
    for text in (call["result"], stored, result.stderr):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    assert stored == call["result"]
    if tool == "spill":  # megabytes in, the budget out, and the model is told it was cut
        assert len(stored) < 2000 and "cut" in stored.lower()
    else:
        assert "red" in stored and "next line" in stored  # the words stay; only the commands go
