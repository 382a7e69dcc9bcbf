"""KVBlockStore when things go wrong around it: leftovers at open, a full disk, foreign paths, a read-only index."""

import errno
import logging
import os

import pytest

import storage.kv.block_file as kv_block_file
import storage.kv.store as kv_store
from storage.db.conversations import ConversationStore
from storage.disk_files import STALE_TEMP_S
from storage.errors import StorageError
from storage.kv.block_file import SUFFIX
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import (CAP, assert_loads, check_index_matches_files, kvb_files, load,
                                            exported_kv)
from tests.storage.kv.kv_store_helpers import dead_pid, keys_of, tokens


# ---- clean-up at open -------------------------------------------------------------------------


def test_opening_removes_stale_temp_files_and_old_orphans_only(tmp_path, conversations, kv):
    conversation = conversations.create("m")
    ids = tokens(1, 8)
    kv.save(conversation.id, exported_kv(ids))
    known = [kv.path(k) for k in keys_of(ids)]
    d = kv.dir
    old = os.path.getmtime(known[0]) - STALE_TEMP_S - 60
    orphan_key, fresh_orphan_key = "a" * 64, "b" * 64
    paths = {
        "old temp": d / f".{'c' * 64}.{os.getpid()}.0a1b2c3d.tmp",
        "dead writer's temp": d / f".{'c' * 64}.{dead_pid()}.0a1b2c3d.tmp",
        "live writer's temp": d / f".{'c' * 64}.{os.getpid()}.0000ffff.tmp",
        "old orphan": d / f"{orphan_key}{SUFFIX}",
        "fresh orphan": d / f"{fresh_orphan_key}{SUFFIX}",
        "something else": d / "notes.txt",
    }
    for path in paths.values():
        path.write_bytes(b"x" * 10)
    for name in ("old temp", "old orphan", "something else"):
        os.utime(paths[name], (old, old))
    os.utime(known[0], (old, old))  # an old file the index knows
    weird = {"dir": d / f"{'d' * 64}{SUFFIX}", "fifo": d / f".{'e' * 64}.1.00.tmp",
             "link": d / f"{'9' * 64}{SUFFIX}"}
    weird["dir"].mkdir()
    os.mkfifo(weird["fifo"])
    weird["link"].symlink_to(tmp_path / "nowhere")
    for path in weird.values():
        os.utime(path, (old, old), follow_symlinks=False)

    KVBlockStore(tmp_path, conversations.database, CAP)
    gone = {name for name, path in paths.items() if not os.path.lexists(path)}
    assert gone == {"old temp", "dead writer's temp", "old orphan"}
    assert all(p.exists() for p in known)
    assert all(os.path.lexists(p) for p in weird.values())
    assert_loads(kv, ids, 2)


def test_a_read_only_store_does_not_clean(tmp_path, conversations, kv):
    kv.dir.mkdir()
    orphan = kv.dir / f"{'a' * 64}{SUFFIX}"
    orphan.write_bytes(b"x")
    os.utime(orphan, (1000, 1000))
    with ConversationStore.open(tmp_path, write=False) as reader:
        KVBlockStore(tmp_path, reader.database, CAP)
    assert orphan.exists()


# ---- failures while writing ---------------------------------------------------------------------


@pytest.mark.parametrize("fail_at", ["write_block", "fsync", "fsync_dir"])
def test_a_full_disk_mid_save_keeps_the_old_state_and_leaves_no_file(kv, conversations, monkeypatch, fail_at):
    conversation = conversations.create("m")
    old = tokens(1, 6)
    kv.save(conversation.id, exported_kv(old))
    before_files, before_rows = kvb_files(kv), kv.index.blocks()
    new = old + tokens(300, 12)
    calls = []

    def disk_full(*args, **kwargs):
        calls.append(args)
        if len(calls) >= 2:  # the first new block is written, the second is not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        if fail_at == "write_block":
            real = kv_store.write_block
            patch.setattr(kv_store, "write_block", disk_full)
        elif fail_at == "fsync":
            real = os.fsync
            patch.setattr(kv_block_file.os, "fsync", disk_full)
        else:
            real = kv_store.fsync_dir
            calls.append(None)  # fails at once: all the new blocks are written, the directory's fsync is not
            patch.setattr(kv_store, "fsync_dir", disk_full)
        with pytest.raises(OSError, match="No space"):
            kv.save(conversation.id, exported_kv(new))
    assert len(calls) >= 2
    assert kvb_files(kv) == before_files
    assert sorted(p.name for p in kv.dir.iterdir()) == sorted(before_files)  # no temp file either
    assert kv.index.blocks() == before_rows
    assert kv.index.heads_of(conversation.id) == {keys_of(old)[-1]: 6}
    check_index_matches_files(kv)
    assert_loads(kv, old, 2)
    # Space again: the save goes through.
    kv.save(conversation.id, exported_kv(new))
    assert_loads(kv, new, 5)


def test_an_index_that_cannot_be_written_leaves_no_new_file(kv, conversations, monkeypatch):
    conversation = conversations.create("m")
    old = tokens(1, 4)
    kv.save(conversation.id, exported_kv(old))
    before = kvb_files(kv)

    def busy(*args, **kwargs):
        raise StorageError("the database is busy")

    monkeypatch.setattr(kv.index, "commit", busy)
    with pytest.raises(StorageError):
        kv.save(conversation.id, exported_kv(old + tokens(50, 9)))
    assert kvb_files(kv) == before
    assert_loads(kv, old, 1)


# ---- paths that are not ours ---------------------------------------------------------------------


def test_a_kv_directory_that_leads_outside_the_data_dir_is_refused(tmp_path, conversations):
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (home / "kv").symlink_to(outside)
    old = outside / f"{'a' * 64}{SUFFIX}"
    old.write_bytes(b"x")
    os.utime(old, (1000, 1000))  # an "orphan" a clean-up that followed the link would remove
    kv = KVBlockStore(home, conversations.database, CAP)
    conversation = conversations.create("m")
    with pytest.raises(StorageError, match="outside the data directory"):
        kv.save(conversation.id, exported_kv(tokens(1, 8)))
    assert [p.name for p in outside.iterdir()] == [old.name]
    assert kv.index.blocks() == []
    with pytest.raises(StorageError):
        kv.path("a" * 64)


@pytest.mark.parametrize("key", ["../" + "a" * 61, "A" * 64, "a" * 63, "", "a" * 64 + "/x"])
def test_keys_that_are_not_hex_digests_never_become_paths(kv, key):
    with pytest.raises(StorageError, match="not a KV block key"):
        kv.path(key)


# ---- a read-only index ----------------------------------------------------------------------------


def test_a_read_only_index_never_writes(tmp_path, conversations, kv, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 12)
    keys = keys_of(ids)
    kv.save(conversation.id, exported_kv(ids))
    data = bytearray(kv.path(keys[1]).read_bytes())
    data[-1] ^= 1
    kv.path(keys[1]).write_bytes(bytes(data))  # damaged: a writable store would delete it
    rows = kv.index.blocks()
    files = {p.name: p.stat().st_mtime_ns for p in kv.dir.iterdir()}
    for reader_store in ("write=False", "read_only_reason"):
        if reader_store == "write=False":
            reader = ConversationStore.open(tmp_path, write=False)
        else:
            reader = ConversationStore.open(tmp_path)
            reader.read_only_reason = "the disk is read-only"
        with reader:
            ro = KVBlockStore(tmp_path, reader.database, cap_bytes=1)  # a cap it would have to evict for
            assert not ro.writable
            other = conversations.create("m")
            assert ro.save(other.id, exported_kv(tokens(900, 8))) == 0
            with caplog.at_level(logging.WARNING, logger="kvchat"):
                assert load(ro, ids)[0] == 1
            ro.enforce_cap()
            ro.remove(keys)
            ro.remove_unreferenced(keys)
            assert ro.stats().blocks == 3
        assert kv.index.blocks() == rows
        assert {p.name: p.stat().st_mtime_ns for p in kv.dir.iterdir()} == files
        assert kv.index.heads_of(other.id) == {}
