"""A delete wins over a snapshot being written: `wanted` is asked before and after the rename.

The deleter's two steps (the conversation is deleted, so `wanted` turns False;
then its snapshot file is unlinked) are placed at every point of a save, and
in every order of placement no snapshot survives.
"""

import itertools

import pytest

from storage.snapshot_writer import SnapshotWriter
from storage.snapshots import SnapshotStore
from tests.storage.test_snapshots import CONVERSATION, FINGERPRINT, make_snapshot

# Points of a save where the deleter's steps can run: before/after each call of `wanted`, or after the save.
CALLS = 3  # before writing, right before the rename, right after it
SLOTS = [(when, call) for call in range(CALLS) for when in ("before", "after")] + [("end", CALLS)]


class Deleter:
    """The conversation's existence, and a deleter whose steps run at chosen slots."""

    def __init__(self, store: SnapshotStore, delete_at, unlink_at):
        self.store, self.exists, self.calls = store, True, 0
        self.steps: dict = {}
        self.steps.setdefault(delete_at, []).append(self.delete_conversation)
        self.steps.setdefault(unlink_at, []).append(self.unlink_snapshot)  # after the delete in a shared slot
        self.order: list[str] = []

    def delete_conversation(self):
        self.exists = False
        self.order.append("delete")

    def unlink_snapshot(self):
        assert self.order == ["delete"], "the deleter unlinks after deleting"
        self.store.delete(CONVERSATION)
        self.order.append("unlink")

    def run(self, slot):
        for step in self.steps.pop(slot, []):
            step()

    def finish(self):
        """The deleter goes on after the save: steps whose slot never came (the save stopped early) run now."""
        for slot in SLOTS:
            self.run(slot)

    def wanted(self) -> bool:
        call, self.calls = self.calls, self.calls + 1
        self.run(("before", call))
        answer = self.exists
        self.run(("after", call))
        return answer


@pytest.mark.parametrize("delete_at, unlink_at", [
    (a, b) for a, b in itertools.combinations_with_replacement(SLOTS, 2)])
def test_no_snapshot_of_a_deleted_conversation_survives_any_interleaving(tmp_path, delete_at, unlink_at):
    store = SnapshotStore(tmp_path / "home", cap_bytes=1 << 30)
    store.save(CONVERSATION, make_snapshot(seed=1))  # the previous turn's snapshot
    deleter = Deleter(store, delete_at, unlink_at)
    store.save(CONVERSATION, make_snapshot(seed=2), wanted=deleter.wanted)
    deleter.finish()
    assert deleter.order == ["delete", "unlink"]
    assert list(store.dir.iterdir()) == []  # no snapshot, no temp file


def test_a_snapshot_that_is_still_wanted_is_written(tmp_path):
    store = SnapshotStore(tmp_path / "home", cap_bytes=1 << 30)
    calls = []
    size = store.save(CONVERSATION, make_snapshot(), wanted=lambda: calls.append(1) or True)
    assert size == store.path(CONVERSATION).stat().st_size and len(calls) == CALLS
    assert store.load(CONVERSATION, FINGERPRINT, make_snapshot().token_ids) is not None


def test_a_snapshot_that_turned_unwanted_reports_nothing_written(tmp_path):
    store = SnapshotStore(tmp_path / "home", cap_bytes=1 << 30)
    answers = iter([True, True, False])
    assert store.save(CONVERSATION, make_snapshot(), wanted=lambda: next(answers)) == 0
    assert not store.path(CONVERSATION).exists()


def test_a_failing_wanted_after_the_rename_keeps_no_file_and_propagates(tmp_path):
    store = SnapshotStore(tmp_path / "home", cap_bytes=1 << 30)
    answers = iter([True, True])

    def wanted():
        answer = next(answers, None)
        if answer is None:
            raise OSError("database is locked")
        return answer

    with pytest.raises(OSError, match="locked"):
        store.save(CONVERSATION, make_snapshot(), wanted=wanted)
    assert list(store.dir.iterdir()) == []


def test_the_writer_asks_wanted_and_skips_a_conversation_deleted_before_its_turn(tmp_path):
    store = SnapshotStore(tmp_path / "home", cap_bytes=1 << 30)
    writer = SnapshotWriter(store)
    try:
        writer.submit(CONVERSATION, make_snapshot(), wanted=lambda: False)
        writer.submit("aaaaaaaaaaaa", make_snapshot(), wanted=lambda: True)
        assert writer.flush(30)
    finally:
        writer.close()
    assert not store.path(CONVERSATION).exists() and store.path("aaaaaaaaaaaa").exists()
