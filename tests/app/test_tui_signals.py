"""The chat app in a real terminal (a tmux pane), ended mid-reply by `kill` (SIGTERM) or by its terminal going
away (`tmux kill-server` hangs up on it, as closing a window does): the reply is kept as stopped, with its
snapshot, instead of being left `streaming` with its last half second of text lost."""

import os
import shutil
import signal
import time

import pytest

from storage.conversations import ConversationStore
from tests.app.tmux_terminal import Terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

LOADED = "cpu float32"  # the status bar names the device and dtype once the model has loaded


def streaming_reply(home, timeout=120.0) -> str:
    """The conversation whose reply is streaming, once it has a few tokens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ConversationStore.open(home, write=False) as store:
            for conversation in store.list():
                last = store.branch(conversation.id)[-1]
                if last.role == "assistant" and len(last.token_ids) >= 5:
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
def test_the_chat_ended_mid_reply_keeps_the_reply_as_stopped_with_its_snapshot(endless_model_dir, kvchat_home,
                                                                              tmp_path, end):
    terminal = Terminal(kvchat_home, tmp_path)
    try:
        terminal.start("--model", str(endless_model_dir), "--temperature", "0", "--max-tokens", "3000")
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
    assert (kvchat_home / "snapshots" / f"{conversation}.safetensors").is_file()
