"""The chat app in a real terminal (a tmux pane), ended mid-reply by `kill` (SIGTERM) or by its terminal going
away (`tmux kill-server` hangs up on it, as closing a window does): the reply is kept as stopped, with its
K/V blocks, instead of being left `streaming` with its last half second of text lost."""

import os
import shutil
import signal
import time

import pytest

from storage.db.conversations import ConversationStore
from tests.app.kv_blocks import conversation_kv
from tests.app.tui.tmux_terminal import Terminal

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

LOADED = "cpu float32"  # the status bar names the device and dtype once the model has loaded


def streaming_reply(home, timeout=120.0) -> str:
    """The conversation whose reply is streaming, once it has a few tokens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ConversationStore.open(home, write=False) as store:
            for conversation in store.list():
                branch = store.branch(conversation.id)  # empty for a moment: created, its message not yet added
                if branch and branch[-1].role == "assistant" and len(branch[-1].token_ids) >= 5:
                    return conversation.id
        time.sleep(0.1)
    raise AssertionError("the reply never started streaming")


def gone(pid: int, timeout: float = 60.0) -> bool:
    """The process exited. A zombie counts: once the terminal is gone, kvchat's parent may be an init
    that never reaps it (a container's), and a zombie still answers kill(pid, 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.usefixtures("endless_replies")  # no loop check: the reply must still stream when it is ended
@pytest.mark.parametrize("end", ["sigterm", "hangup"])
def test_the_chat_ended_mid_reply_keeps_the_reply_as_stopped_with_its_kv_blocks(endless_model_dir, kvchat_home,
                                                                              tmp_path, end):
    terminal = Terminal(kvchat_home, tmp_path)
    try:
        terminal.start("--model", str(endless_model_dir), "--temperature", "0", "--max-tokens", "3000",
                       env={"TEST_STEP_S": "0.005"})  # 15 s of reply: still streaming when it is ended
        terminal.wait_for("the model loaded", lambda screen: LOADED in screen, 120)
        pid = terminal.kvchat_pid()
        terminal.send("tell me everything")
        conversation = streaming_reply(kvchat_home)
        if end == "sigterm":
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while terminal.exit_status() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert terminal.exit_status() == 128 + signal.SIGTERM, terminal.report()
        else:
            terminal.close()  # the terminal goes away: SIGHUP to everything in it
        assert gone(pid), "kvchat still runs"
    finally:
        terminal.close()
    with ConversationStore.open(kvchat_home, write=False) as store:
        reply = store.branch(conversation)[-1]
    assert (reply.role, reply.status) == ("assistant", "stopped")
    assert 5 <= len(reply.token_ids) < 3000 and reply.stats["finish_reason"] == "stopped"
    tokens, blocks = conversation_kv(kvchat_home, conversation)  # its K/V stored, the stopped reply's too
    assert tokens >= reply.token_start + len(reply.token_ids) - 1 and all(block.is_file() for block in blocks)


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_suspended_chat_comes_back_on_sigcont(endless_model_dir, kvchat_home, tmp_path):
    # The SIGCONT a closed terminal sends must not restart the screen (app/tui/terminal_signals.py);
    # the one that follows a suspend (SIGTSTP: `kill -TSTP`, or a shell's job control) still must.
    terminal = Terminal(kvchat_home, tmp_path)
    try:
        terminal.start("--model", str(endless_model_dir), "--temperature", "0", "--max-tokens", "3")
        terminal.wait_for("the model loaded", lambda screen: LOADED in screen, 120)
        pid = terminal.kvchat_pid()
        os.kill(pid, signal.SIGTSTP)
        deadline = time.monotonic() + 30
        while process_state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_state(pid) == "T", "SIGTSTP did not suspend kvchat"
        os.kill(pid, signal.SIGCONT)  # what the shell's `fg` sends
        terminal.send("back again")
        terminal.wait_for("the message after resuming", lambda screen: "back again" in screen, 60)
        assert terminal.quit() == 0, terminal.report()
    finally:
        terminal.close()
