"""KVWriter over a real KVBlockStore: the newest pending state of a conversation wins, jobs wait for
pending writes, a failing save is logged and not raised, flush waits."""

import logging
import threading

import pytest

import storage.kv.store as kv_store
from storage.kv.block_file import chain_keys
from storage.kv.writer import KVWriter
from tests.storage.kv.kv_store_helpers import BLOCK_SIZE, FINGERPRINT, assert_loads, kvb_files, exported_kv

WAIT_S = 10



class Gate:
    """Stands in for kv_store.write_block: records the key of every block written (in `events`, which
    jobs write to as well); the first write waits until released, so submissions pile up behind it;
    the blocks of `fail_for` fail as on a full disk."""

    def __init__(self, fail_for=()):
        self.real = kv_store.write_block
        self.events: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_for = set(fail_for)

    def __call__(self, directory, key, *args, **kwargs):
        if not self.started.is_set():
            self.started.set()
            assert self.release.wait(WAIT_S)
        if key in self.fail_for:
            raise OSError(28, "No space left on device")
        self.events.append(key)
        return self.real(directory, key, *args, **kwargs)


@pytest.fixture
def gate(monkeypatch) -> Gate:
    gate = Gate()
    monkeypatch.setattr(kv_store, "write_block", gate)
    return gate


@pytest.fixture
def writer(kv):
    writer = KVWriter(kv)
    yield writer
    writer.close(WAIT_S)


def keys_of(token_ids):
    return chain_keys(FINGERPRINT, list(token_ids), BLOCK_SIZE)


def tokens(start, count):
    return list(range(start, start + count))


def test_only_the_newest_pending_state_of_a_conversation_is_written(kv, conversations, gate, writer):
    a, b = conversations.create("m"), conversations.create("m")
    a1 = tokens(1, 4)
    a2, a3, b1 = a1 + tokens(100, 4), a1 + tokens(200, 4), tokens(1000, 4)
    writer.submit(a.id, exported_kv(a1))
    assert gate.started.wait(WAIT_S)  # a1 is being written; the rest queue up
    writer.submit(b.id, exported_kv(b1))
    writer.submit(a.id, exported_kv(a2))
    writer.submit(a.id, exported_kv(a3))  # replaces a2, which was never started
    gate.release.set()
    assert writer.flush(WAIT_S)
    assert gate.events == [keys_of(a1)[0], keys_of(b1)[0], keys_of(a3)[1]]
    assert not kv.index.present(keys_of(a2)[1:])
    assert keys_of(a3)[-1] in kv.index.heads_of(a.id)
    assert_loads(kv, a3, 2)
    assert_loads(kv, b1, 1)


def test_a_failing_save_is_one_log_line_and_the_writer_goes_on(kv, conversations, monkeypatch, caplog):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 8), tokens(500, 8)
    gate = Gate(fail_for=keys_of(a_ids))
    gate.release.set()
    monkeypatch.setattr(kv_store, "write_block", gate)
    writer = KVWriter(kv)
    try:
        with caplog.at_level(logging.WARNING, logger="kvchat"):
            writer.submit(a.id, exported_kv(a_ids))  # raises OSError on the writer thread: logged, not raised
            writer.submit(b.id, exported_kv(b_ids))
            assert writer.flush(WAIT_S)
    finally:
        writer.close(WAIT_S)
    assert kv.index.heads_of(a.id) == {} and kv.index.heads_of(b.id) == {keys_of(b_ids)[-1]: 8}
    assert kvb_files(kv) == {kv.path(k).name for k in keys_of(b_ids)}  # nothing of a's left behind
    failures = [r.getMessage() for r in caplog.records if a.id in r.getMessage()]
    assert len(failures) == 1 and "No space" in failures[0]


def test_a_job_runs_after_the_writes_pending_when_it_is_its_turn(conversations, gate, writer):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 4), tokens(500, 4)
    writer.submit(a.id, exported_kv(a_ids))
    assert gate.started.wait(WAIT_S)
    writer.run_job(lambda: gate.events.append("job"))
    writer.submit(b.id, exported_kv(b_ids))  # submitted after the job, written before it
    gate.release.set()
    assert writer.flush(WAIT_S)
    assert gate.events == [keys_of(a_ids)[0], keys_of(b_ids)[0], "job"]


def test_flush_times_out_while_a_write_is_stuck(kv, conversations, gate, writer):
    conversation = conversations.create("m")
    writer.submit(conversation.id, exported_kv(tokens(1, 4)))
    assert gate.started.wait(WAIT_S)
    assert not writer.flush(0.2)
    gate.release.set()
    assert writer.flush(WAIT_S)
    assert kv.index.heads_of(conversation.id) == {keys_of(tokens(1, 4))[-1]: 4}


def test_a_conversation_deleted_before_its_turn_keeps_no_blocks(kv, conversations, gate, writer):
    first, deleted, unwanted, kept = (conversations.create("m") for _ in range(4))
    writer.submit(first.id, exported_kv(tokens(1, 4)))
    assert gate.started.wait(WAIT_S)
    writer.submit(deleted.id, exported_kv(tokens(100, 4)), wanted=lambda: conversations.exists(deleted.id))
    writer.submit(unwanted.id, exported_kv(tokens(200, 4)), wanted=lambda: False)
    writer.submit(kept.id, exported_kv(tokens(300, 4)), wanted=lambda: conversations.exists(kept.id))
    conversations.delete(deleted.id)  # wanted is asked on the writer thread, when its turn comes
    gate.release.set()
    assert writer.flush(WAIT_S)
    assert gate.events == [keys_of(tokens(1, 4))[0], keys_of(tokens(300, 4))[0]]
    assert kvb_files(kv) == {kv.path(k).name for k in gate.events}
    assert kv.index.heads_of(kept.id) == {keys_of(tokens(300, 4))[-1]: 4}


def test_close_writes_what_is_pending_and_ends_the_thread_holding_no_tensor(kv, conversations):
    import gc
    import weakref

    conversation = conversations.create("m")
    written = exported_kv(tokens(1, 8))
    tensor = weakref.ref(written.kv)
    writer = KVWriter(kv)
    writer.submit(conversation.id, written)
    del written
    assert writer.flush(WAIT_S)
    gc.collect()
    assert tensor() is None  # the idle thread keeps no K/V alive (it would be freed as the process ends)
    writer.close(WAIT_S)
    assert not writer._thread.is_alive()  # nothing left running, in torch or not, once close returns
    assert kv.index.heads_of(conversation.id) == {keys_of(tokens(1, 8))[-1]: 8}
