"""SnapshotWriter: the newest snapshot of a conversation wins, failures are logged, flush waits."""

import logging
import threading

from storage.snapshot_writer import SnapshotWriter


class FakeStore:
    """Records saves; the first one blocks until released, so submissions can pile up behind it."""

    def __init__(self, fail_for=()):
        self.saved: list[tuple[str, object]] = []
        self.release = threading.Event()
        self.started = threading.Event()
        self.fail_for = set(fail_for)

    def save(self, conversation_id, snapshot, wanted=None):
        self.started.set()
        self.release.wait(10)
        if conversation_id in self.fail_for:
            raise OSError(28, "No space left on device")
        self.saved.append((conversation_id, snapshot))
        return 1


def test_only_the_newest_pending_snapshot_of_a_conversation_is_written():
    store = FakeStore()
    writer = SnapshotWriter(store)
    writer.submit("aaaa", "a1")
    store.started.wait(10)  # a1 is being written; the rest queue up
    writer.submit("bbbb", "b1")
    writer.submit("aaaa", "a2")
    writer.submit("aaaa", "a3")
    store.release.set()
    assert writer.flush(10)
    assert store.saved == [("aaaa", "a1"), ("bbbb", "b1"), ("aaaa", "a3")]
    writer.close()


def test_a_failed_write_is_one_log_line_and_the_writer_goes_on(caplog):
    store = FakeStore(fail_for={"aaaa"})
    store.release.set()
    writer = SnapshotWriter(store)
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        writer.submit("aaaa", "a1")
        writer.submit("bbbb", "b1")
        assert writer.flush(10)
    assert store.saved == [("bbbb", "b1")]
    assert [r.getMessage() for r in caplog.records if "aaaa" in r.getMessage() and "No space" in r.getMessage()]
    writer.close()


def test_flush_times_out_while_a_write_is_stuck():
    store = FakeStore()
    writer = SnapshotWriter(store)
    writer.submit("aaaa", "a1")
    assert not writer.flush(0.2)
    store.release.set()
    assert writer.flush(10)
    writer.close()
