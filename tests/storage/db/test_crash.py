"""A kvchat killed at any moment loses nothing it reported saved, and the reply it was streaming
comes back as interrupted; two kvchats writing at once lose nothing."""

import itertools
import random
import signal
import sqlite3
import time

import pytest

from storage.db.conversations import ConversationStore
from tests.storage.db.conversation_writer import spawn, start_together, text_hash

pytestmark = pytest.mark.slow  # writer processes killed at random moments, in loops

KILLS = 15


def kill_at_a_random_moment(home, output, rng) -> None:
    with output.open("w") as out:
        writer = spawn(home, "stream", stdout=out)
    while not output.read_text():  # until it has saved something
        assert writer.poll() is None, writer.stderr.read()
        time.sleep(0.01)
    time.sleep(rng.uniform(0, 0.25))
    writer.kill()
    writer.wait()
    assert writer.returncode == -signal.SIGKILL, writer.stderr.read()


def allowed_states(output) -> dict[str, set[tuple[str, str]]]:
    """(status, text hash) each acknowledged message may hold: its last acknowledged state and,
    for the write the kill may have cut between commit and ack, the state it announced."""
    # A line the kill cut short has no newline, and its commit had not begun.
    lines = [line.split() for line in output.read_text().splitlines(keepends=True) if line.endswith("\n")]
    allowed = {}
    for word, message_id, status, digest in lines:
        if word == "ack":
            allowed[message_id] = {(status, digest)}
    word, message_id, status, digest = lines[-1]
    if word == "will":
        allowed[message_id].add((status, digest))
    return allowed


def stored_states(path) -> dict[str, tuple[str, str]]:
    """(status, text hash) of every message, read without kvchat after checking the file."""
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        db.execute("INSERT INTO messages_fts (messages_fts) VALUES ('integrity-check')")  # raises if out of step
        return {id_: (status, text_hash(text)) for id_, status, text in db.execute("SELECT id, status, text FROM messages")}
    finally:
        db.close()


def test_a_writer_killed_at_random_moments_loses_nothing_it_acknowledged(kvchat_home, tmp_path):
    rng = random.Random()
    path = kvchat_home / "kvchat.db"
    settled = {}  # every message as verified after the earlier kills: later runs must not change it
    recovered = 0
    for kill in range(KILLS):
        output = tmp_path / f"writer{kill}.out"
        kill_at_a_random_moment(kvchat_home, output, rng)

        before = stored_states(path)
        for message_id, states in allowed_states(output).items():
            assert before[message_id] in states, output.read_text()[-2000:]
        assert {m: before[m] for m in settled} == settled

        ConversationStore.open().close()  # opening marks the killed writer's reply interrupted
        after = stored_states(path)
        assert after == {m: ("interrupted" if status == "streaming" else status, digest)
                         for m, (status, digest) in before.items()}
        recovered += sum(status == "streaming" for status, _ in before.values())
        settled = after
    assert recovered > 0, "no kill landed while a reply was streaming"


def test_two_processes_writing_at_once_lose_no_write(kvchat_home):
    with ConversationStore.open() as store:
        conversation = store.create("m")
    count = 300
    writers = [spawn(kvchat_home, "burst", conversation.id, tag, str(count)) for tag in ("left", "right")]
    start_together(writers)
    for writer in writers:
        _, errors = writer.communicate()
        assert writer.returncode == 0, errors

    with ConversationStore.open() as store:
        assert len(store.all_messages(conversation.id)) == 2 * count
        last = {}
        for tag in ("left", "right"):
            (last[tag],) = store.db.execute("SELECT id FROM messages WHERE text = ?", [f"{tag} {count - 1}"]).fetchone()
            chain = store.branch(conversation.id, leaf=last[tag])
            assert [m.text for m in chain] == [f"{tag} {i}" for i in range(count)]
        assert store.get(conversation.id).active_leaf in last.values()
        order = [text.split()[0] for (text,) in store.db.execute("SELECT text FROM messages ORDER BY seq")]
        assert len(list(itertools.groupby(order))) > 2, "the writers took turns only once: they did not overlap"
