"""KVBlockStore: blocks written once and shared, read back exactly, damage contained, the cap, the clean-up."""

import errno
import logging
import os
import subprocess
import sys

import pytest
import torch

import storage.kv_block_file as kv_block_file
import storage.kv_store as kv_store
from storage.conversations import ConversationStore
from storage.errors import StorageError
from storage.kv_block_file import SUFFIX, chain_keys
from storage.kv_store import KVBlockStore
from storage.disk_files import STALE_TEMP_S
from tests.storage.kv_store_helpers import (CAP, BLOCK_SIZE, FINGERPRINT, assert_loads, check_heads_loadable,
                                            check_index_matches_files, fresh_dests, kv_of, kvb_files, load,
                                            snapshot)




def keys_of(token_ids, fingerprint=FINGERPRINT):
    return chain_keys(fingerprint, list(token_ids), BLOCK_SIZE)


def file_bytes(kv, keys):
    return sum(kv.path(k).stat().st_size for k in keys)


def tokens(start, count):
    return list(range(start, start + count))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---- round trip ---------------------------------------------------------------------


@pytest.mark.parametrize("count", [4, 10, 1])
def test_a_saved_chain_reads_back_identical_into_fresh_blocks(kv, conversations, count):
    conversation = conversations.create("m")
    ids = tokens(1000, count)
    written = kv.save(conversation.id, snapshot(ids))
    keys = keys_of(ids)
    assert written == file_bytes(kv, keys) > 0
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys}
    assert conversations.kv_heads_of(conversation.id) == {keys[-1]: count}
    read, plan, dests = load(kv, ids)
    assert read == len(plan) == len(keys) and [b.key for b in plan] == keys
    assert torch.equal(dests, kv_of(ids))  # zeroed past a partial block's tokens, not the 5s they held
    # The next prompt starts with the saved tokens: the same blocks serve it.
    read, plan, dests = load(kv, ids + [7, 8, 9])
    assert read == len(keys) and torch.equal(dests, kv_of(ids))
    check_index_matches_files(kv)


def test_bfloat16_chains_round_trip(kv, conversations):
    conversation = conversations.create("m")
    ids = tokens(1, 9)
    kv.save(conversation.id, snapshot(ids, dtype=torch.bfloat16))
    plan = kv.plan(FINGERPRINT, BLOCK_SIZE, ids)
    dests = fresh_dests(len(plan), torch.bfloat16)
    assert kv.read(plan, dests) == 3
    assert torch.equal(dests, kv_of(ids, torch.bfloat16))


def test_a_second_save_writes_only_the_new_blocks_and_the_partial_one_again(kv, conversations):
    conversation = conversations.create("m")
    first = tokens(1, 10)  # 2 full blocks + 2 tokens
    kv.save(conversation.id, snapshot(first))
    old_partial = keys_of(first)[2]
    second = first + tokens(500, 7)  # 17 tokens: 4 full blocks + 1
    keys = keys_of(second)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, second)
    assert start == 2  # block 2 is the old partial one, now full: another key
    written = kv.save(conversation.id, snapshot(second, first_block=start))
    assert written == file_bytes(kv, keys[2:])
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys}  # 5 files: the superseded partial block is gone
    assert not kv.path(old_partial).exists() and not conversations.kv_present([old_partial])
    assert conversations.kv_heads_of(conversation.id) == {keys[-1]: 17}
    assert_loads(kv, second, 5)
    # Saving the same state again writes nothing.
    assert kv.save(conversation.id, snapshot(second)) == 0
    assert kv.first_missing(FINGERPRINT, BLOCK_SIZE, second) == 5


def test_a_save_with_no_tokens_or_a_zero_cap_writes_nothing(tmp_path, kv, conversations):
    conversation = conversations.create("m")
    assert kv.save(conversation.id, snapshot([])) == 0
    off = KVBlockStore(tmp_path, conversations, cap_bytes=0)
    assert off.save(conversation.id, snapshot(tokens(1, 8))) == 0
    assert kv.save(conversation.id, snapshot(tokens(1, 8)), wanted=lambda: False) == 0
    assert kvb_files(kv) == set() and conversations.kv_blocks() == []


def test_non_finite_kv_are_not_saved_from_the_bad_block_on(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 12)
    bad = snapshot(ids)
    bad.kv[1, 0, 0, 0, 2, 3] = float("nan")
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        kv.save(conversation.id, bad)
    assert "not finite" in caplog.text
    keys = keys_of(ids)
    assert kvb_files(kv) == {f"{keys[0]}{SUFFIX}"}
    assert conversations.kv_heads_of(conversation.id) == {keys[0]: 4}
    assert_loads(kv, ids, 1)


# ---- sharing ---------------------------------------------------------------------------


def test_ten_conversations_sharing_a_long_prefix_store_it_once(kv, conversations):
    prefix = tokens(1, 40)  # 10 full blocks
    prefix_keys = keys_of(prefix)
    ids = {}
    for n in range(10):
        conversation = conversations.create("m")
        ids[conversation.id] = prefix + tokens(10_000 * (n + 1), 6)  # +1 full block of its own, +1 partial
        written = kv.save(conversation.id, snapshot(ids[conversation.id]))
        own = keys_of(ids[conversation.id])[10:]
        assert written == file_bytes(kv, (prefix_keys if n == 0 else []) + own)
    shared = file_bytes(kv, prefix_keys)
    assert len(kvb_files(kv)) == 10 + 10 * 2
    stats = kv.stats()
    assert (stats.blocks, stats.shared_blocks, stats.conversations) == (30, 10, 10)
    assert stats.shared_bytes == shared and stats.saved_bytes == 9 * shared
    assert stats.bytes == stats.referenced_bytes == sum(p.stat().st_size for p in kv.dir.iterdir())
    for conversation_id, token_ids in ids.items():
        assert_loads(kv, token_ids, 12)
        check_heads_loadable(kv, conversation_id)


def test_a_new_prompt_finds_another_conversations_blocks(kv, conversations):
    a = conversations.create("m")
    prefix = tokens(1, 12)
    kv.save(a.id, snapshot(prefix + [77, 78, 79]))
    new_prompt = prefix + [90, 91, 92, 93, 94]  # what follows the prefix differs from its first token
    read, plan, dests = load(kv, new_prompt)
    assert read == len(plan) == 3 and [b.key for b in plan] == keys_of(prefix)
    assert torch.equal(dests, kv_of(prefix))
    # A prompt that shares part of a's partial last block gets it whole (the cache lends the shared tokens).
    read, plan, dests = load(kv, prefix + [77, 78, 50, 51, 52])
    assert read == 4 and plan[-1].token_ids == (77, 78, 79)
    assert torch.equal(dests, kv_of(prefix + [77, 78, 79]))


def test_plan_ignores_blocks_saved_under_another_fingerprint(kv, conversations):
    a = conversations.create("m")
    other = "0" * 64
    ids = tokens(1, 10)
    kv.save(a.id, snapshot(ids, fingerprint=other))
    assert kv.plan(FINGERPRINT, BLOCK_SIZE, ids) == []
    assert kv.first_missing(FINGERPRINT, BLOCK_SIZE, ids) == 0
    assert_loads(kv, ids, 3, fingerprint=other)
    # A partial first block of another model hangs under the same root: still not ours.
    b = conversations.create("m")
    kv.save(b.id, snapshot([5, 6], fingerprint=other))
    assert kv.plan(FINGERPRINT, BLOCK_SIZE, [5, 6, 7]) == []
    assert len(kv.plan(other, BLOCK_SIZE, [5, 6, 7])) == 1


# ---- damage -----------------------------------------------------------------------------


def test_a_damaged_block_in_the_middle_stops_the_read_and_is_rewritten_alone(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 20)  # 5 full blocks
    keys = keys_of(ids)
    kv.save(conversation.id, snapshot(ids))
    damaged = kv.path(keys[2])
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0x40  # in the K/V
    damaged.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        read, plan, dests = load(kv, ids)
    assert read == 2 and len(plan) == 5
    assert torch.equal(dests[:2], kv_of(ids[:8]))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and keys[2][:12] in warnings[0].getMessage()
    assert not damaged.exists() and not conversations.kv_present([keys[2]])
    check_index_matches_files(kv)
    # What is left of the conversation's chain is still its own: the cap and a clean-up keep it.
    assert kv.remove_unreferenced(set(keys[:2])) == 0
    check_heads_loadable(kv, conversation.id)
    assert_loads(kv, ids, 2)
    # The next save of the same tokens writes only the missing block.
    before = {k: kv.path(k).stat().st_ino for k in keys if k != keys[2]}
    assert kv.save(conversation.id, snapshot(ids)) == file_bytes(kv, [keys[2]])
    assert {k: kv.path(k).stat().st_ino for k in keys if k != keys[2]} == before
    assert conversations.kv_heads_of(conversation.id) == {keys[-1]: 20}
    assert_loads(kv, ids, 5)


def test_a_missing_block_file_is_forgotten_and_the_read_stops_before_it(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 12)
    keys = keys_of(ids)
    kv.save(conversation.id, snapshot(ids))
    kv.path(keys[1]).unlink()
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        read, _, _ = load(kv, ids)
    assert read == 1 and "missing" in caplog.text
    assert conversations.kv_present(keys) == {keys[0], keys[2]}
    check_index_matches_files(kv)
    check_heads_loadable(kv, conversation.id)


def test_a_directory_in_place_of_a_block_is_forgotten_not_removed(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 8)
    keys = keys_of(ids)
    kv.save(conversation.id, snapshot(ids))
    kv.path(keys[0]).unlink()
    kv.path(keys[0]).mkdir()
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert load(kv, ids)[0] == 0
    assert kv.path(keys[0]).is_dir()
    assert keys[0] not in conversations.kv_present(keys)


# ---- the cap and removal ------------------------------------------------------------------


def test_the_cap_evicts_unreferenced_blocks_first_then_referenced_ones_from_the_chain_end(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 16), tokens(5000, 12)  # full blocks only: all the same size
    kv.save(a.id, snapshot(a_ids))
    kv.save(b.id, snapshot(b_ids))
    one = kv.path(keys_of(a_ids)[0]).stat().st_size
    conversations.delete(b.id)  # its head goes (cascade); its blocks stay until something removes them
    assert conversations.kv_heads_of(b.id) == {} and len(kvb_files(kv)) == 7
    kv.cap_bytes = 5 * one
    kv.enforce_cap()  # two of b's blocks are enough
    assert len(kvb_files(kv)) == 5
    assert all(kv.path(k).exists() for k in keys_of(a_ids))
    kv.cap_bytes = 3 * one
    kv.enforce_cap()  # b's last one, then a's last one
    a_keys = keys_of(a_ids)
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in a_keys[:3]}
    assert conversations.kv_heads_of(a.id) == {a_keys[2]: 12}  # the head moved to the parent
    check_index_matches_files(kv)
    check_heads_loadable(kv, a.id)
    assert_loads(kv, a_ids, 3)
    kv.cap_bytes = one
    kv.enforce_cap()
    assert conversations.kv_heads_of(a.id) == {a_keys[0]: 4}
    assert_loads(kv, a_ids, 1)


def test_the_cap_takes_the_least_recently_used_chain_end_first(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 8), tokens(5000, 8)
    kv.save(a.id, snapshot(a_ids))
    kv.save(b.id, snapshot(b_ids))
    one = kv.path(keys_of(a_ids)[0]).stat().st_size
    load(kv, a_ids)  # a is used again: b's end is now the least recently used
    kv.cap_bytes = 3 * one
    kv.enforce_cap()
    assert conversations.kv_heads_of(a.id) == {keys_of(a_ids)[1]: 8}
    assert conversations.kv_heads_of(b.id) == {keys_of(b_ids)[0]: 4}


def test_a_save_enforces_the_cap(tmp_path, conversations):
    probe = KVBlockStore(tmp_path, conversations, CAP)
    one_block = probe.save(None, snapshot(tokens(1, 4)))
    probe.remove(keys_of(tokens(1, 4)))
    kv = KVBlockStore(tmp_path, conversations, cap_bytes=2 * one_block)
    conversation = conversations.create("m")
    ids = tokens(1, 16)
    kv.save(conversation.id, snapshot(ids))
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys_of(ids)[:2]}
    check_heads_loadable(kv, conversation.id)


def test_removing_what_a_deleted_conversation_does_not_share(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    prefix = tokens(1, 12)
    a_ids, b_ids = prefix + tokens(100, 6), prefix + tokens(200, 9)
    kv.save(a.id, snapshot(a_ids))
    kv.save(b.id, snapshot(b_ids))
    b_chain = conversations.kv_chain(b.id)
    assert b_chain == set(keys_of(b_ids))
    conversations.delete(b.id)
    assert kv.remove_unreferenced(b_chain) == 3  # b's own 2 full blocks and its partial one
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys_of(a_ids)}
    assert_loads(kv, a_ids, 5)
    assert kv.stats().shared_blocks == 0


@pytest.mark.parametrize("how", ["delete", "trash"])
def test_a_conversation_deleted_before_the_commit_gets_no_head(kv, conversations, monkeypatch, how):
    conversation = conversations.create("m")
    ids = tokens(1, 10)
    real_fsync_dir = kv_store.fsync_dir

    def delete_meanwhile(path):  # after the block files are written, before the index transaction
        real_fsync_dir(path)
        if how == "delete":
            conversations.delete(conversation.id)
        else:
            conversations.trash(conversation.id)

    monkeypatch.setattr(kv_store, "fsync_dir", delete_meanwhile)
    assert kv.save(conversation.id, snapshot(ids)) > 0
    assert conversations.kv_heads_of(conversation.id) == {}
    assert conversations.kv_present(keys_of(ids)) == set(keys_of(ids))  # stored, but no one's
    assert conversations.kv_references() == {}
    assert kv.remove_unreferenced(keys_of(ids)) == 3
    assert kvb_files(kv) == set()


def test_a_save_for_a_trashed_conversation_keeps_no_head(kv, conversations):
    conversation = conversations.create("m")
    conversations.trash(conversation.id)
    kv.save(conversation.id, snapshot(tokens(1, 6)))
    assert conversations.kv_heads_of(conversation.id) == {} and conversations.kv_references() == {}


# ---- clean-up at open -------------------------------------------------------------------------


def test_opening_removes_stale_temp_files_and_old_orphans_only(tmp_path, conversations, kv):
    conversation = conversations.create("m")
    ids = tokens(1, 8)
    kv.save(conversation.id, snapshot(ids))
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

    KVBlockStore(tmp_path, conversations, CAP)
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
        KVBlockStore(tmp_path, reader, CAP)
    assert orphan.exists()


# ---- failures while writing ---------------------------------------------------------------------


@pytest.mark.parametrize("fail_at", ["write_block", "fsync", "fsync_dir"])
def test_a_full_disk_mid_save_keeps_the_old_state_and_leaves_no_file(kv, conversations, monkeypatch, fail_at):
    conversation = conversations.create("m")
    old = tokens(1, 6)
    kv.save(conversation.id, snapshot(old))
    before_files, before_rows = kvb_files(kv), conversations.kv_blocks()
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
            kv.save(conversation.id, snapshot(new))
    assert len(calls) >= 2
    assert kvb_files(kv) == before_files
    assert sorted(p.name for p in kv.dir.iterdir()) == sorted(before_files)  # no temp file either
    assert conversations.kv_blocks() == before_rows
    assert conversations.kv_heads_of(conversation.id) == {keys_of(old)[-1]: 6}
    check_index_matches_files(kv)
    assert_loads(kv, old, 2)
    # Space again: the save goes through.
    kv.save(conversation.id, snapshot(new))
    assert_loads(kv, new, 5)


def test_an_index_that_cannot_be_written_leaves_no_new_file(kv, conversations, monkeypatch):
    conversation = conversations.create("m")
    old = tokens(1, 4)
    kv.save(conversation.id, snapshot(old))
    before = kvb_files(kv)

    def busy(*args, **kwargs):
        raise StorageError("the database is busy")

    monkeypatch.setattr(conversations, "kv_commit", busy)
    with pytest.raises(StorageError):
        kv.save(conversation.id, snapshot(old + tokens(50, 9)))
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
    kv = KVBlockStore(home, conversations, CAP)
    conversation = conversations.create("m")
    with pytest.raises(StorageError, match="outside the data directory"):
        kv.save(conversation.id, snapshot(tokens(1, 8)))
    assert [p.name for p in outside.iterdir()] == [old.name]
    assert conversations.kv_blocks() == []
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
    kv.save(conversation.id, snapshot(ids))
    data = bytearray(kv.path(keys[1]).read_bytes())
    data[-1] ^= 1
    kv.path(keys[1]).write_bytes(bytes(data))  # damaged: a writable store would delete it
    rows = conversations.kv_blocks()
    files = {p.name: p.stat().st_mtime_ns for p in kv.dir.iterdir()}
    for reader_store in ("write=False", "read_only_reason"):
        if reader_store == "write=False":
            reader = ConversationStore.open(tmp_path, write=False)
        else:
            reader = ConversationStore.open(tmp_path)
            reader.read_only_reason = "the disk is read-only"
        with reader:
            ro = KVBlockStore(tmp_path, reader, cap_bytes=1)  # a cap it would have to evict for
            assert not ro.writable
            other = conversations.create("m")
            assert ro.save(other.id, snapshot(tokens(900, 8))) == 0
            with caplog.at_level(logging.WARNING, logger="kvchat"):
                assert load(ro, ids)[0] == 1
            ro.enforce_cap()
            ro.remove(keys)
            ro.remove_unreferenced(keys)
            assert ro.stats().blocks == 3
        assert conversations.kv_blocks() == rows
        assert {p.name: p.stat().st_mtime_ns for p in kv.dir.iterdir()} == files
        assert conversations.kv_heads_of(other.id) == {}


def test_a_branch_keeps_its_own_chain_beside_the_one_it_left(kv, conversations):
    conversation = conversations.create("m")
    trunk = tokens(1, 10)  # 2 full blocks + (9, 10)
    branch = tokens(1, 9) + [60, 61, 62]  # block 2 starts with 9, then goes elsewhere
    kv.save(conversation.id, snapshot(trunk))
    kv.save(conversation.id, snapshot(branch))
    assert conversations.kv_heads_of(conversation.id) == {keys_of(trunk)[2]: 10, keys_of(branch)[2]: 12}
    assert len(kvb_files(kv)) == 4
    assert_loads(kv, trunk, 3)
    assert_loads(kv, branch, 3)
    check_heads_loadable(kv, conversation.id)
    # The trunk grows: its partial block is superseded, the branch's chain stays.
    kv.save(conversation.id, snapshot(trunk + [11, 12, 13]))
    assert conversations.kv_heads_of(conversation.id) == {keys_of(trunk + [11, 12, 13])[3]: 13,
                                                          keys_of(branch)[2]: 12}
    assert not kv.path(keys_of(trunk)[2]).exists()
    check_heads_loadable(kv, conversation.id)


def test_a_damaged_shared_block_cuts_every_chain_through_it_to_its_parent(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    prefix = tokens(1, 12)
    a_ids, b_ids = prefix + tokens(100, 5), prefix + tokens(200, 2)
    kv.save(a.id, snapshot(a_ids))
    kv.save(b.id, snapshot(b_ids))
    shared = keys_of(prefix)
    kv.path(shared[1]).write_bytes(b"torn")
    assert load(kv, b_ids)[0] == 1
    assert conversations.kv_heads_of(a.id) == {shared[0]: 4}
    assert conversations.kv_heads_of(b.id) == {shared[0]: 4}
    assert set(conversations.kv_references()) == {shared[0]}
    for conversation in (a, b):
        check_heads_loadable(kv, conversation.id)
    kv.save(a.id, snapshot(a_ids))  # a's next turn: its chain whole again, b's still cut
    assert conversations.kv_heads_of(a.id) == {keys_of(a_ids)[-1]: 17}
    assert_loads(kv, a_ids, 5)
    check_index_matches_files(kv)


def test_a_save_whose_earlier_blocks_were_evicted_meanwhile_leaves_no_broken_chain(kv, conversations):
    """The chat asks first_missing, then hands the writer only the blocks from there on; if the cap (another
    conversation's save) evicts the block before them in between, they cannot hang under it."""
    conversation = conversations.create("m")
    first = tokens(1, 12)
    kv.save(conversation.id, snapshot(first))
    longer = first + tokens(400, 6)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    assert start == 3
    kv.remove([keys_of(first)[2]])  # what the cap does to the chain's end
    kv.save(conversation.id, snapshot(longer, first_block=start))
    check_index_matches_files(kv)
    check_heads_loadable(kv, conversation.id)
    assert set(conversations.kv_references()) >= set(keys_of(first)[:2])
    assert_loads(kv, longer, 2)
    # The next turn starts from the gap and completes the chain.
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    assert start == 2
    kv.save(conversation.id, snapshot(longer, first_block=start))
    assert_loads(kv, longer, 5)
    check_heads_loadable(kv, conversation.id)


def test_a_chain_another_kvchat_evicted_part_of_before_the_commit_gets_no_head(kv, conversations, monkeypatch):
    """The same race across processes, after save's own check: the commit's transaction checks that every
    block of the chain is in the index before it names the chain as the conversation's."""
    conversation = conversations.create("m")
    first = tokens(1, 12)
    kv.save(conversation.id, snapshot(first))
    heads_before = conversations.kv_heads_of(conversation.id)
    longer = first + tokens(400, 6)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    commit = conversations.kv_commit

    def evicted_first(*args, **kwargs):  # another process's eviction lands between the files and the commit
        conversations.kv_remove([keys_of(first)[1]])
        return commit(*args, **kwargs)

    monkeypatch.setattr(conversations, "kv_commit", evicted_first)
    kv.save(conversation.id, snapshot(longer, first_block=start))
    heads = conversations.kv_heads_of(conversation.id)
    assert keys_of(longer)[-1] not in heads  # the chain past the gap is not the conversation's
    assert set(heads) == {keys_of(first)[0]} and heads != heads_before  # what is left of the old chain
    check_heads_loadable(kv, conversation.id)
    assert_loads(kv, longer, 1)
