"""A second process writing to the conversation store in $KVCHAT_HOME, for the crash and
concurrency tests. Imports storage only (no torch), so it starts fast.

    stream           a conversation of turns whose replies stream in small updates, until killed;
                     prints "will ID STATUS HASH" before and "ack ID STATUS HASH" after each commit
    burst CONV TAG N add N messages "TAG i" to conversation CONV, each the reply to the last
    open             open the store (and so create or migrate the database)

burst and open first print "ready" and wait for a line on stdin, so that two of them can be
started together (start_together).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def spawn(home: Path, *args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    """Start this script in a subprocess on the store in `home`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.storage.db.conversation_writer", *args],
        cwd=REPO_ROOT, env={**os.environ, "KVCHAT_HOME": str(home)},
        stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.PIPE, text=True,
    )


def start_together(writers: list[subprocess.Popen]) -> None:
    """Let writers started in burst or open mode go at the same moment."""
    for writer in writers:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _say(word: str, message_id: str, status: str, text: str) -> None:
    # One short line, one write(2): a kill leaves it whole or absent.
    print(word, message_id, status, text_hash(text), flush=True)


def stream(store) -> None:
    conversation = store.create("writer-model")
    parent_id, position = None, 0
    for turn in range(1_000_000):
        question = f"question {turn} from {os.getpid()}"
        user = store.add_message(conversation.id, parent_id, "user", question, position, [turn, 1, 2])
        _say("ack", user.id, "complete", question)
        reply = store.add_message(conversation.id, user.id, "assistant", "", position + 3, [], status="streaming")
        _say("ack", reply.id, "streaming", "")
        text = ""
        for step in range(12):
            text += f" word{step}"
            _say("will", reply.id, "streaming", text)
            store.update_message(reply.id, text=text, token_ids=list(range(step + 1)))
            _say("ack", reply.id, "streaming", text)
        _say("will", reply.id, "complete", text)
        store.update_message(reply.id, status="complete", stats={"finish_reason": "stop"})
        _say("ack", reply.id, "complete", text)
        parent_id, position = reply.id, position + 3 + 12


def burst(store, conversation_id: str, tag: str, count: int) -> None:
    parent_id = None
    for i in range(count):
        parent_id = store.add_message(conversation_id, parent_id, "user", f"{tag} {i}", i, [i]).id
        # Leave the lock free a moment, as a chat does between writes: SQLite's busy wait backs
        # off, so a writer that never pauses keeps the lock until it is done.
        time.sleep(0.001)


def main(mode: str, *args: str) -> None:
    from storage.db.conversations import ConversationStore

    if mode != "stream":
        print("ready", flush=True)
        sys.stdin.readline()
    with ConversationStore.open() as store:
        if mode == "stream":
            stream(store)
        elif mode == "burst":
            burst(store, args[0], args[1], int(args[2]))


if __name__ == "__main__":
    main(*sys.argv[1:])
