"""`kvchat` under abuse, in child processes: a full disk, signals, a reader that goes away, bytes that are
not UTF-8, exports onto existing files and links, and saved text that holds terminal escapes."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.in_process_cli import assert_one_clear_error, kvchat
from tests.app.kv_blocks import conversation_kv
from tests.disk_full import compiler, nearly_full_disk

REPO = Path(__file__).resolve().parents[3]
GREEDY = ("--temperature", "0")
STREAMING = {"TEST_STEP_S": "0.005"}  # a 3,000-token reply takes 15 s: still streaming when a test ends it


def child(*args, env=None, **popen):
    """kvchat in a child process (tests/app/cli/cli_child.py), its save interval from TEST_PARTIAL_SAVE_S."""
    return subprocess.Popen([sys.executable, "-m", "tests.app.cli.cli_child", *args], cwd=REPO,
                            env={**os.environ, **(env or {})}, **popen)


def first_turn(model_dir, env=None) -> str:
    result = kvchat("ask", "hello", "--model", str(model_dir), *GREEDY, "--max-tokens", "4", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["conversation_id"]


def messages(conversation_id):
    result = kvchat("export", conversation_id, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["messages"]


def kvchat_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("kvchat: ")]


# ---- a full disk ------------------------------------------------------------------------------


needs_cc = pytest.mark.skipif(compiler() is None, reason="the disk-full shim is compiled with the C compiler")


@pytest.mark.usefixtures("endless_replies")
@needs_cc
@pytest.mark.slow  # a `kvchat ask` process under a full disk
def test_a_reply_saved_at_every_token_fits_where_the_old_saves_filled_the_disk(endless_model_dir, kvchat_home,
                                                                                tmp_path):
    # 300 KB free and a save at every one of 400 tokens: each save used to append ~26 KB to the
    # write-ahead log (the row and its search entry rewritten), so the disk filled after a dozen
    # saves: 392 warnings, exit 1, 8 of the reply's characters kept. Now a save appends a page.
    conversation = first_turn(endless_model_dir)
    env = {**nearly_full_disk(kvchat_home, 300_000, tmp_path), "TEST_PARTIAL_SAVE_S": "0"}
    run = child("ask", "more please", "--conversation", conversation, "--model", str(endless_model_dir), *GREEDY,
                "--max-tokens", "400", "--kv-disk-gb", "0", env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert "could not be saved" not in err and "Traceback" not in err
    reply = messages(conversation)[-1]
    assert (reply["role"], reply["status"], len(reply["token_ids"])) == ("assistant", "complete", 400)
    assert reply["text"] + "\n" == out


@pytest.mark.usefixtures("endless_replies")
@needs_cc
@pytest.mark.slow  # a `kvchat ask` process under a full disk
def test_a_disk_that_fills_mid_reply_keeps_what_fit_says_so_once_and_exits_1(endless_model_dir, kvchat_home,
                                                                              tmp_path):
    conversation = first_turn(endless_model_dir)
    full = tmp_path / "the-disk-is-full-now"
    env = {**nearly_full_disk(kvchat_home, 10_000_000, tmp_path, fills_when=full), "TEST_PARTIAL_SAVE_S": "0"}
    run = child("ask", "more please", "--conversation", conversation, "--model", str(endless_model_dir), *GREEDY,
                "--max-tokens", "600", "--kv-disk-gb", "0", env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE)
    shown = os.read(run.stdout.fileno(), 200)  # the reply streams and is being saved
    full.touch()
    out, err = run.communicate(timeout=300)
    shown, err = (shown + out).decode(), err.decode()
    assert run.returncode == 1, err
    lines = kvchat_lines(err)
    # One warning when the saves start failing, one sentence at the end: not one line per save.
    assert len(lines) == 2 and "disk is full" in lines[-1].lower() and "Traceback" not in err, err
    assert "interrupted" in lines[-1]
    reply = messages(conversation)[-1]  # opening the database again marks the reply interrupted
    assert (reply["role"], reply["status"]) == ("assistant", "interrupted")
    assert len(reply["text"]) >= 100 and shown.startswith(reply["text"])  # the start of what was shown


# ---- signals and readers that go away -----------------------------------------------------------


def streaming_ask(model_dir, *extra, stdout=subprocess.PIPE):
    run = child("ask", "write on", "--model", str(model_dir), *GREEDY, "--max-tokens", "3000", *extra,
                stdout=stdout, stderr=subprocess.PIPE, env=STREAMING)
    return run


@pytest.mark.usefixtures("endless_replies")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.slow  # a `kvchat ask` process, signalled
def test_a_stop_signal_keeps_the_reply_as_stopped_with_its_kv_blocks(endless_model_dir, kvchat_home, sig):
    # SIGTERM and SIGHUP (a closed terminal) used to kill the process: exit 143/129, the row left
    # `streaming`, the last 0.5 s of text and the K/V blocks lost. Now they act as Ctrl+C does.
    run = streaming_ask(endless_model_dir)
    shown = os.read(run.stdout.fileno(), 64)  # the reply has started streaming
    run.send_signal(sig)
    out, err = run.communicate(timeout=120)
    err = err.decode()
    assert run.returncode == 128 + sig, err
    assert "Traceback" not in err
    conversation = re.search(r"conversation ([0-9a-f]{12})", err).group(1)
    reply = messages(conversation)[-1]
    assert (reply["status"], reply["stats"]["finish_reason"]) == ("stopped", "stopped")
    assert 0 < len(reply["token_ids"]) < 3000
    assert (shown + out).decode().strip() == reply["text"].strip()  # everything shown was kept
    tokens, blocks = conversation_kv(kvchat_home, conversation)  # its K/V stored, the stopped reply's too
    assert tokens >= reply["token_start"] + len(reply["token_ids"]) - 1 and all(block.is_file() for block in blocks)


@pytest.mark.usefixtures("endless_replies")
@pytest.mark.slow  # a `kvchat ask` process whose reader goes away
def test_a_reader_that_goes_away_stops_the_reply_quietly_and_keeps_it(endless_model_dir, kvchat_home):
    reader = subprocess.Popen(["head", "-c", "20"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    run = streaming_ask(endless_model_dir, stdout=reader.stdin)
    reader.stdin.close()
    _, err = run.communicate(timeout=120)
    reader.wait(timeout=10)
    err = err.decode()
    assert run.returncode == 141, err  # as a shell reports `yes | head`
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    conversation = re.search(r"conversation ([0-9a-f]{12})", err).group(1)
    reply = messages(conversation)[-1]
    assert reply["status"] == "stopped" and len(reply["token_ids"]) < 3000


@pytest.fixture(scope="module")
def four_conversations(tiny_model_dir, tmp_path_factory):
    """A data dir with four saved conversations and the first one's id, made once: the listing commands
    only read it, and each `ask` child imports torch (seconds)."""
    home = {"KVCHAT_HOME": str(tmp_path_factory.mktemp("four-conversations"))}
    ids = [first_turn(tiny_model_dir, env=home) for _ in range(4)]
    return home, ids[0]


@pytest.mark.parametrize("command", [["list"], ["show", "{id}"], ["search", "hello"], ["export", "{id}"]])
def test_listing_commands_into_a_closed_pipe_exit_quietly(four_conversations, command):
    home, conversation = four_conversations
    args = [a.replace("{id}", conversation) for a in command]
    pipeline = subprocess.run(f"{sys.executable} -m app.cli {' '.join(args)} | head -c 1 >/dev/null",
                              shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **home, "PYTHONUNBUFFERED": "1"})
    assert "Traceback" not in pipeline.stderr and "Exception ignored" not in pipeline.stderr, pipeline.stderr


# ---- bytes that are not UTF-8 -----------------------------------------------------------------


@pytest.mark.slow  # a `kvchat ask` process: its argv and stdin as bytes
def test_a_message_with_bytes_that_are_not_utf8_is_answered_with_one_notice(tiny_model_dir):
    # It used to be a 35-line TypeError from the tokenizer, after the model had loaded.
    run = subprocess.run([sys.executable, "-m", "app.cli", "ask", "-", "--model", str(tiny_model_dir), *GREEDY,
                          "--max-tokens", "3", "--json", "--system", os.fsdecode(b"be \xff brief")],
                         input=b"caf\xe9 and \xff\xfe", capture_output=True, cwd=REPO, timeout=120)
    err = run.stderr.decode()
    assert run.returncode == 0, err
    assert "Traceback" not in err
    assert "The message had 3 bytes that are not UTF-8" in err and "The system prompt had 1 byte" in err
    conversation = json.loads(run.stdout)["conversation_id"]
    assert messages(conversation)[0]["text"] == "caf\ufffd and \ufffd\ufffd"


def test_search_and_rename_take_bytes_that_are_not_utf8(tiny_model_dir):
    conversation = first_turn(tiny_model_dir)
    raw = os.fsdecode(b"caf\xe9")
    searched = subprocess.run([sys.executable, "-m", "app.cli", "search", raw], capture_output=True, cwd=REPO)
    assert searched.returncode == 1 and b"Traceback" not in searched.stderr and b"codec" not in searched.stderr
    renamed = subprocess.run([sys.executable, "-m", "app.cli", "rename", conversation, raw], capture_output=True,
                             cwd=REPO)
    assert renamed.returncode == 0, renamed.stderr
    assert kvchat("list").stdout.split("  ")[-1].strip() == "caf\ufffd"


# ---- exports -----------------------------------------------------------------------------------


def test_export_never_replaces_a_file_unless_forced_and_never_writes_through_a_link(tiny_model_dir, tmp_path):
    conversation = first_turn(tiny_model_dir)
    target = tmp_path / "notes.md"
    target.write_text("my notes")
    assert_one_clear_error(kvchat("export", conversation, "-o", str(target)), 1, "already exists")
    assert target.read_text() == "my notes"

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    link = tmp_path / "link.md"
    link.symlink_to(precious)
    for args in ([], ["--force"]):
        assert_one_clear_error(kvchat("export", conversation, "-o", str(link), *args), 1, "symbolic link")
    assert precious.read_text() == "keep me" and link.is_symlink()

    assert kvchat("export", conversation, "-o", str(target), "--force").returncode == 0
    assert target.read_text().startswith("# hello")
    fresh = tmp_path / "fresh.json"
    assert kvchat("export", conversation, "-o", str(fresh), "--format", "json").returncode == 0
    assert json.loads(fresh.read_text())["conversation"]["id"] == conversation
    assert [p.name for p in tmp_path.iterdir() if "kvchat-tmp" in p.name] == []  # no temp file left
    dash = kvchat("export", conversation, "-o", "-")
    assert dash.returncode == 0 and dash.stdout.startswith("# hello") and not (tmp_path / "-").exists()


# ---- what reaches the terminal ------------------------------------------------------------------


def test_control_characters_in_titles_and_messages_are_shown_as_escapes(tiny_model_dir):
    conversation = first_turn(tiny_model_dir)
    evil = "\x1b]0;owned\x07\x1b[2Jtitle"
    assert kvchat("rename", conversation, evil).returncode == 0
    for command in (["list"], ["show", conversation], ["search", "hello"]):
        out = kvchat(*command).stdout
        assert "\x1b" not in out and "\x07" not in out, command
    assert "\\x1b]0;owned\\x07\\x1b[2Jtitle" in kvchat("list").stdout
    assert evil in kvchat("export", conversation, "--format", "json").stdout.encode().decode("unicode_escape")


def test_a_huge_id_is_not_echoed_back_whole():
    result = kvchat("show", "f" * 100_000)
    assert_one_clear_error(result, 1, "No conversation matches")
    assert len(result.stderr) < 200


BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def on_a_terminal(*args) -> str:
    """What `kvchat ARGS` writes to stdout when stdout is a terminal (a pseudo-terminal here)."""
    import pty

    leader, follower = pty.openpty()
    run = subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=REPO, stdout=follower,
                           stderr=subprocess.DEVNULL)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert run.wait(timeout=60) == 0
    return out.decode()


def test_bidi_controls_in_titles_are_shown_as_escapes_wherever_text_is_a_view(tiny_model_dir):
    # U+202E in a title made `kvchat list` show the rest of the line reversed ("Trojan Source").
    conversation = first_turn(tiny_model_dir)
    assert kvchat("rename", conversation, f"invoice{BIDI_CONTROLS}fdp.exe").returncode == 0
    for command in (["list"], ["show", conversation], ["search", "hello"]):
        out = kvchat(*command).stdout
        assert not set(BIDI_CONTROLS) & set(out) and "invoice\\u202a\\u202b" in out, command
    shown = on_a_terminal("export", conversation)
    assert not set(BIDI_CONTROLS) & set(shown) and "# invoice\\u202a" in shown
    piped = kvchat("export", conversation, "--format", "json").stdout  # a file format stays exact
    assert json.loads(piped)["conversation"]["title"] == f"invoice{BIDI_CONTROLS}fdp.exe"


def test_the_rename_confirmation_shows_the_title_escaped_once(tiny_model_dir):
    conversation = first_turn(tiny_model_dir)
    result = kvchat("rename", conversation, "\x1b[2Jtitle\u202e")
    assert result.returncode == 0
    assert f"renamed conversation {conversation} to '\\x1b[2Jtitle\\u202e'." in result.stderr, result.stderr
