"""McpHub against servers that misbehave (hostile_server.py, and commands that are not servers at all):
each failure is one sentence or safe text, never an exception, and the hub and its other servers carry on.
One hub, with its servers started once, serves the whole module."""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.tools.mcp.hub import McpHub
from app.tools.mcp.safe_text import estimate_tokens
from app.tools.mcp.server_entry import StdioServer
from app.tools.mcp.settings import McpSettings
from app.tools.spec import ToolCall

HOSTILE = Path(__file__).with_name("hostile_server.py")
SHORT_TIMEOUT_S = 0.5  # for the calls that are meant to time out
RESULT_TOKENS = 300
EXIT_WAIT_S = 10.0  # the server exits 0.2 s after answering; this is only the hang guard
TERMINAL_CONTROL = [chr(c) for c in range(32) if chr(c) not in "\n\t"] + ["\x7f", "\x9b", "\u202e"]


pytestmark = pytest.mark.xdist_group("mcp-hostile")  # one xdist worker starts the servers (--dist loadgroup)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    settings = McpSettings({
        "hostile": StdioServer(sys.executable, (str(HOSTILE),)),
        "missing": StdioServer("no-such-mcp-server-command"),
        "quitter": StdioServer(sys.executable, ("-c", "import sys; sys.exit(5)")),
    }, result_tokens=RESULT_TOKENS)
    with McpHub(settings, log_dir=tmp_path_factory.mktemp("mcp-logs")) as hub:
        hub.tools()  # every server starts (or fails) here, together
        yield hub


def call(hub: McpHub, name: str, timeout: float | None = None, **arguments):
    return hub.call(ToolCall(name, arguments, id="call-1"), timeout=timeout)


def assert_still_works(hub: McpHub):
    result = call(hub, "echo", text="still here")
    assert (result.text, result.is_error) == ("echo: still here", False)


def test_the_hostile_servers_tools_are_offered_and_the_broken_servers_left_out(hub):
    specs = hub.tools()
    assert {spec.server for spec in specs} == {"hostile"}
    assert {"echo", "hang", "crash", "flood"} <= {spec.name for spec in specs}
    status = hub.status()
    assert status["hostile"].state == "ready" and status["hostile"].tools == len(specs)


def test_a_command_that_does_not_exist_is_one_sentence(hub):
    status = hub.status()["missing"]
    assert status.state == "failed"
    assert status.problem == "the command 'no-such-mcp-server-command' of the MCP server 'missing' was not found"
    result = call(hub, "missing__anything")  # a call to its tools says why
    assert result.is_error and result.text == status.problem


def test_a_server_that_exits_at_start_says_how(hub):
    problem = hub.status()["quitter"].problem
    assert problem == "the MCP server 'quitter' exited while starting (exit code 5)"
    assert str(hub.status()["quitter"]).endswith(f"{problem} (its log: {hub.status()['quitter'].log})")


def test_a_hanging_tool_ends_at_its_timeout_and_the_server_still_answers(hub):
    result = call(hub, "hang", timeout=SHORT_TIMEOUT_S)
    assert result.is_error and result.text == "the tool 'hang' of the MCP server 'hostile' did not answer within 0.5 s"
    assert_still_works(hub)


def test_cancel_stops_a_waiting_call_with_stopped(hub):
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    result = hub.call(ToolCall("hang", {}), cancel=cancel)  # the hub's 60 s timeout would say otherwise
    assert (result.text, result.is_error) == ("stopped", True)
    assert_still_works(hub)


def test_a_hanging_call_does_not_hold_up_the_others(hub):
    cancel = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        hanging = pool.submit(hub.call, ToolCall("hang", {}), None, cancel)
        assert_still_works(hub)
        assert not hanging.done()
        cancel.set()
        assert hanging.result().text == "stopped"


def test_a_crash_mid_call_is_one_sentence_and_the_server_starts_again(hub):
    result = call(hub, "crash")
    assert result.is_error
    assert result.text == "the MCP server 'hostile' stopped during the call to 'crash' (exit code 3)"
    assert_still_works(hub)
    assert hub.status()["hostile"].state == "ready"


def test_a_server_that_exits_while_idle_is_marked_so_and_started_again_at_its_next_use(hub):
    assert call(hub, "exit_soon").text == "exiting soon"
    deadline = time.monotonic() + EXIT_WAIT_S
    while hub.status()["hostile"].state != "exited" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.status()["hostile"].problem == "the MCP server 'hostile' stopped (exit code 0)"
    assert_still_works(hub)


def test_a_result_that_is_not_a_tool_result_is_one_sentence(hub):
    result = call(hub, "malformed_result")
    assert result.is_error
    assert result.text == ("the tool 'malformed_result' of the MCP server 'hostile' answered with something "
                           "that is not a tool result")
    assert_still_works(hub)


def test_megabytes_are_cut_to_the_result_budget(hub):
    result = call(hub, "flood", megabytes=3)
    assert result.truncated and not result.is_error
    assert result.text.startswith("line of text line of text") and "[cut: the result was 3,145" in result.text
    assert estimate_tokens(result.text) <= RESULT_TOKENS


def test_a_message_over_the_byte_cap_is_refused_unread_and_the_server_carries_on(hub):
    result = call(hub, "flood", megabytes=20)
    assert result.is_error
    assert result.text == ("the tool 'flood' of the MCP server 'hostile' answered with more than 16 MiB, "
                           "more than kvchat reads")
    assert_still_works(hub)


def test_terminal_escapes_and_controls_never_reach_the_model(hub):
    result = call(hub, "paint")
    assert not any(c in result.text for c in TERMINAL_CONTROL)
    assert "owned title" not in result.text and "evil.example" not in result.text
    assert result.text == "red link bell backspace carriage evil  c1 nul\ttab\nnext line"


def test_bytes_that_are_not_utf8_and_lone_surrogates_are_replaced(hub):
    assert call(hub, "invalid_utf8").text == "bad \ufffd\ufffd bytes \ufffd end"
    result = call(hub, "lone_surrogate")
    assert result.text == "half \ufffd pair" and result.text.encode("utf-8")


def test_a_line_that_is_not_json_rpc_is_logged_and_the_answer_after_it_arrives(hub):
    result = call(hub, "garbage_then_answer")
    assert (result.text, result.is_error) == ("answered after garbage", False)
    log = hub.status()["hostile"].log.read_text(errors="replace")
    assert "the server sent a line that is not JSON-RPC" in log and "this is {not json-rpc" in log


def test_a_timeout_after_garbage_says_the_server_wrote_garbage(hub):
    result = call(hub, "garbage_then_hang", timeout=SHORT_TIMEOUT_S)
    assert result.is_error
    assert "did not answer within 0.5 s (it wrote lines that are not JSON-RPC meanwhile" in result.text
    assert_still_works(hub)


def test_an_image_is_named_not_pasted(hub):
    assert call(hub, "picture").text == "[image: image/png, 1,008 bytes]"


def test_a_servers_stderr_goes_to_its_log_not_the_terminal(hub, capfd):
    assert call(hub, "to_stderr").text == "said something on stderr"
    assert "a server's chatter on stderr" in hub.status()["hostile"].log.read_text(errors="replace")
    assert "chatter" not in capfd.readouterr().err


def test_the_sdks_warnings_about_a_server_stay_off_the_terminal(hub, caplog):
    # The SDK warns (with a traceback) about a malformed notification; the hub sends its loggers to sdk.log,
    # so nothing reaches the root logger, whose last resort is stderr (under the chat).
    assert call(hub, "bad_notification").text == "sent a bad notification"
    assert_still_works(hub)
    assert [record.getMessage() for record in caplog.records] == []


def test_a_tools_own_error_is_its_text_and_an_unknown_tool_one_sentence(hub):
    result = call(hub, "echo", wrong=1)
    assert result.is_error and "Error executing tool echo" in result.text and "Field required" in result.text
    assert call(hub, "no_such_tool").text == "no MCP server offers a tool named 'no_such_tool'"


def test_a_server_that_never_answers_its_start_fails_at_the_start_timeout(tmp_path):
    silent = StdioServer(sys.executable, ("-c", "import time; time.sleep(300)"))
    with McpHub(McpSettings({"silent": silent}), log_dir=tmp_path, start_timeout=0.5) as hub:
        assert hub.tools() == []
        problem = hub.status()["silent"].problem
        assert problem == "the MCP server 'silent' did not answer within 0.5 s of starting"
        assert hub.call(ToolCall("silent__x", {})).text == problem  # failed for good: not started again


def test_after_close_a_call_is_one_sentence(tmp_path):
    hub = McpHub(McpSettings({"hostile": StdioServer(sys.executable, (str(HOSTILE),))}), log_dir=tmp_path)
    hub.close()
    assert hub.call(ToolCall("echo", {"text": "x"})).text == "the MCP servers were closed"
    assert hub.tools() == []
