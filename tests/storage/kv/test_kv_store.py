"""KVBlockStore: blocks written once and shared, read back exactly, damage contained.

The cap and removal: test_kv_store_eviction.py; faults around the store: test_kv_store_faults.py."""

import logging
import os

import pytest
import torch

from storage.kv.block_file import SUFFIX
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import (BLOCK_SIZE, FINGERPRINT, assert_loads, check_heads_loadable,
                                            check_index_matches_files, fresh_dests, kv_of, kvb_files, load,
                                            exported_kv)
from tests.storage.kv.kv_store_helpers import file_bytes, keys_of, tokens


# ---- round trip ---------------------------------------------------------------------


@pytest.mark.parametrize("count", [4, 10, 1])
def test_a_saved_chain_reads_back_identical_into_fresh_blocks(kv, conversations, count):
    conversation = conversations.create("m")
    ids = tokens(1000, count)
    written = kv.save(conversation.id, exported_kv(ids))
    keys = keys_of(ids)
    assert written == file_bytes(kv, keys) > 0
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys}
    assert kv.index.heads_of(conversation.id) == {keys[-1]: count}
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
    kv.save(conversation.id, exported_kv(ids, dtype=torch.bfloat16))
    plan = kv.plan(FINGERPRINT, BLOCK_SIZE, ids)
    dests = fresh_dests(len(plan), torch.bfloat16)
    assert kv.read(plan, dests) == 3
    assert torch.equal(dests, kv_of(ids, torch.bfloat16))


def test_a_second_save_writes_only_the_new_blocks_and_the_partial_one_again(kv, conversations):
    conversation = conversations.create("m")
    first = tokens(1, 10)  # 2 full blocks + 2 tokens
    kv.save(conversation.id, exported_kv(first))
    old_partial = keys_of(first)[2]
    second = first + tokens(500, 7)  # 17 tokens: 4 full blocks + 1
    keys = keys_of(second)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, second)
    assert start == 2  # block 2 is the old partial one, now full: another key
    written = kv.save(conversation.id, exported_kv(second, first_block=start))
    assert written == file_bytes(kv, keys[2:])
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys}  # 5 files: the superseded partial block is gone
    assert not kv.path(old_partial).exists() and not kv.index.present([old_partial])
    assert kv.index.heads_of(conversation.id) == {keys[-1]: 17}
    assert_loads(kv, second, 5)
    # Saving the same state again writes nothing.
    assert kv.save(conversation.id, exported_kv(second)) == 0
    assert kv.first_missing(FINGERPRINT, BLOCK_SIZE, second) == 5


def test_a_save_with_no_tokens_or_a_zero_cap_writes_nothing(tmp_path, kv, conversations):
    conversation = conversations.create("m")
    assert kv.save(conversation.id, exported_kv([])) == 0
    off = KVBlockStore(tmp_path, conversations.database, cap_bytes=0)
    assert off.save(conversation.id, exported_kv(tokens(1, 8))) == 0
    assert kv.save(conversation.id, exported_kv(tokens(1, 8)), wanted=lambda: False) == 0
    assert kvb_files(kv) == set() and kv.index.blocks() == []


def test_non_finite_kv_are_not_saved_from_the_bad_block_on(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 12)
    bad = exported_kv(ids)
    bad.kv[1, 0, 0, 0, 2, 3] = float("nan")
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        kv.save(conversation.id, bad)
    assert "not finite" in caplog.text
    keys = keys_of(ids)
    assert kvb_files(kv) == {f"{keys[0]}{SUFFIX}"}
    assert kv.index.heads_of(conversation.id) == {keys[0]: 4}
    assert_loads(kv, ids, 1)


# ---- sharing ---------------------------------------------------------------------------


def test_ten_conversations_sharing_a_long_prefix_store_it_once(kv, conversations):
    prefix = tokens(1, 40)  # 10 full blocks
    prefix_keys = keys_of(prefix)
    ids = {}
    for n in range(10):
        conversation = conversations.create("m")
        ids[conversation.id] = prefix + tokens(10_000 * (n + 1), 6)  # +1 full block of its own, +1 partial
        written = kv.save(conversation.id, exported_kv(ids[conversation.id]))
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
    kv.save(a.id, exported_kv(prefix + [77, 78, 79]))
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
    kv.save(a.id, exported_kv(ids, fingerprint=other))
    assert kv.plan(FINGERPRINT, BLOCK_SIZE, ids) == []
    assert kv.first_missing(FINGERPRINT, BLOCK_SIZE, ids) == 0
    assert_loads(kv, ids, 3, fingerprint=other)
    # A partial first block of another model hangs under the same root: still not ours.
    b = conversations.create("m")
    kv.save(b.id, exported_kv([5, 6], fingerprint=other))
    assert kv.plan(FINGERPRINT, BLOCK_SIZE, [5, 6, 7]) == []
    assert len(kv.plan(other, BLOCK_SIZE, [5, 6, 7])) == 1


# ---- damage -----------------------------------------------------------------------------


def test_a_damaged_block_in_the_middle_stops_the_read_and_is_rewritten_alone(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 20)  # 5 full blocks
    keys = keys_of(ids)
    kv.save(conversation.id, exported_kv(ids))
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
    assert not damaged.exists() and not kv.index.present([keys[2]])
    check_index_matches_files(kv)
    # What is left of the conversation's chain is still its own: the cap and a clean-up keep it.
    assert kv.remove_unreferenced(set(keys[:2])) == 0
    check_heads_loadable(kv, conversation.id)
    assert_loads(kv, ids, 2)
    # The next save of the same tokens writes only the missing block.
    before = {k: kv.path(k).stat().st_ino for k in keys if k != keys[2]}
    assert kv.save(conversation.id, exported_kv(ids)) == file_bytes(kv, [keys[2]])
    assert {k: kv.path(k).stat().st_ino for k in keys if k != keys[2]} == before
    assert kv.index.heads_of(conversation.id) == {keys[-1]: 20}
    assert_loads(kv, ids, 5)


def test_a_missing_block_file_is_forgotten_and_the_read_stops_before_it(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 12)
    keys = keys_of(ids)
    kv.save(conversation.id, exported_kv(ids))
    kv.path(keys[1]).unlink()
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        read, _, _ = load(kv, ids)
    assert read == 1 and "missing" in caplog.text
    assert kv.index.present(keys) == {keys[0], keys[2]}
    check_index_matches_files(kv)
    check_heads_loadable(kv, conversation.id)


def test_an_empty_directory_in_place_of_a_block_is_forgotten_and_removed(kv, conversations, caplog):
    conversation = conversations.create("m")
    ids = tokens(1, 8)
    keys = keys_of(ids)
    kv.save(conversation.id, exported_kv(ids))
    kv.path(keys[0]).unlink()
    kv.path(keys[0]).mkdir()
    with caplog.at_level(logging.WARNING, logger="kvchat"):
        assert load(kv, ids)[0] == 0
    assert not os.path.lexists(kv.path(keys[0]))  # one with files in it: test_kv_folder_in_place.py
    assert keys[0] not in kv.index.present(keys)


# ---- branches ----------------------------------------------------------------------------------


def test_a_branch_keeps_its_own_chain_beside_the_one_it_left(kv, conversations):
    conversation = conversations.create("m")
    trunk = tokens(1, 10)  # 2 full blocks + (9, 10)
    branch = tokens(1, 9) + [60, 61, 62]  # block 2 starts with 9, then goes elsewhere
    kv.save(conversation.id, exported_kv(trunk))
    kv.save(conversation.id, exported_kv(branch))
    assert kv.index.heads_of(conversation.id) == {keys_of(trunk)[2]: 10, keys_of(branch)[2]: 12}
    assert len(kvb_files(kv)) == 4
    assert_loads(kv, trunk, 3)
    assert_loads(kv, branch, 3)
    check_heads_loadable(kv, conversation.id)
    # The trunk grows: its partial block is superseded, the branch's chain stays.
    kv.save(conversation.id, exported_kv(trunk + [11, 12, 13]))
    assert kv.index.heads_of(conversation.id) == {keys_of(trunk + [11, 12, 13])[3]: 13,
                                                          keys_of(branch)[2]: 12}
    assert not kv.path(keys_of(trunk)[2]).exists()
    check_heads_loadable(kv, conversation.id)


def test_a_damaged_shared_block_cuts_every_chain_through_it_to_its_parent(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    prefix = tokens(1, 12)
    a_ids, b_ids = prefix + tokens(100, 5), prefix + tokens(200, 2)
    kv.save(a.id, exported_kv(a_ids))
    kv.save(b.id, exported_kv(b_ids))
    shared = keys_of(prefix)
    kv.path(shared[1]).write_bytes(b"torn")
    assert load(kv, b_ids)[0] == 1
    assert kv.index.heads_of(a.id) == {shared[0]: 4}
    assert kv.index.heads_of(b.id) == {shared[0]: 4}
    assert set(kv.index.references()) == {shared[0]}
    for conversation in (a, b):
        check_heads_loadable(kv, conversation.id)
    kv.save(a.id, exported_kv(a_ids))  # a's next turn: its chain whole again, b's still cut
    assert kv.index.heads_of(a.id) == {keys_of(a_ids)[-1]: 17}
    assert_loads(kv, a_ids, 5)
    check_index_matches_files(kv)
