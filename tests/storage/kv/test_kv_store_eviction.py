"""KVBlockStore: the size cap and removal by reference, and evictions that race a save."""

import pytest

import storage.kv.store as kv_store
from storage.kv.block_file import SUFFIX
from storage.kv.store import KVBlockStore
from tests.storage.kv.kv_store_helpers import (CAP, BLOCK_SIZE, FINGERPRINT, assert_loads, check_heads_loadable,
                                            check_index_matches_files, kvb_files, load, exported_kv)
from tests.storage.kv.kv_store_helpers import keys_of, tokens


# ---- the cap and removal ------------------------------------------------------------------


def test_the_cap_evicts_unreferenced_blocks_first_then_referenced_ones_from_the_chain_end(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 16), tokens(5000, 12)  # full blocks only: all the same size
    kv.save(a.id, exported_kv(a_ids))
    kv.save(b.id, exported_kv(b_ids))
    one = kv.path(keys_of(a_ids)[0]).stat().st_size
    conversations.delete(b.id)  # its head goes (cascade); its blocks stay until something removes them
    assert kv.index.heads_of(b.id) == {} and len(kvb_files(kv)) == 7
    kv.cap_bytes = 5 * one
    kv.enforce_cap()  # two of b's blocks are enough
    assert len(kvb_files(kv)) == 5
    assert all(kv.path(k).exists() for k in keys_of(a_ids))
    kv.cap_bytes = 3 * one
    kv.enforce_cap()  # b's last one, then a's last one
    a_keys = keys_of(a_ids)
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in a_keys[:3]}
    assert kv.index.heads_of(a.id) == {a_keys[2]: 12}  # the head moved to the parent
    check_index_matches_files(kv)
    check_heads_loadable(kv, a.id)
    assert_loads(kv, a_ids, 3)
    kv.cap_bytes = one
    kv.enforce_cap()
    assert kv.index.heads_of(a.id) == {a_keys[0]: 4}
    assert_loads(kv, a_ids, 1)


def test_the_cap_takes_the_least_recently_used_chain_end_first(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    a_ids, b_ids = tokens(1, 8), tokens(5000, 8)
    kv.save(a.id, exported_kv(a_ids))
    kv.save(b.id, exported_kv(b_ids))
    one = kv.path(keys_of(a_ids)[0]).stat().st_size
    load(kv, a_ids)  # a is used again: b's end is now the least recently used
    kv.cap_bytes = 3 * one
    kv.enforce_cap()
    assert kv.index.heads_of(a.id) == {keys_of(a_ids)[1]: 8}
    assert kv.index.heads_of(b.id) == {keys_of(b_ids)[0]: 4}


def test_a_save_enforces_the_cap(tmp_path, conversations):
    probe = KVBlockStore(tmp_path, conversations.database, CAP)
    one_block = probe.save(None, exported_kv(tokens(1, 4)))
    probe.remove(keys_of(tokens(1, 4)))
    kv = KVBlockStore(tmp_path, conversations.database, cap_bytes=2 * one_block)
    conversation = conversations.create("m")
    ids = tokens(1, 16)
    kv.save(conversation.id, exported_kv(ids))
    assert kvb_files(kv) == {f"{k}{SUFFIX}" for k in keys_of(ids)[:2]}
    check_heads_loadable(kv, conversation.id)


def test_removing_what_a_deleted_conversation_does_not_share(kv, conversations):
    a, b = conversations.create("m"), conversations.create("m")
    prefix = tokens(1, 12)
    a_ids, b_ids = prefix + tokens(100, 6), prefix + tokens(200, 9)
    kv.save(a.id, exported_kv(a_ids))
    kv.save(b.id, exported_kv(b_ids))
    b_chain = kv.index.chain(b.id)
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
    assert kv.save(conversation.id, exported_kv(ids)) > 0
    assert kv.index.heads_of(conversation.id) == {}
    assert kv.index.present(keys_of(ids)) == set(keys_of(ids))  # stored, but no one's
    assert kv.index.references() == {}
    assert kv.remove_unreferenced(keys_of(ids)) == 3
    assert kvb_files(kv) == set()


def test_a_save_for_a_trashed_conversation_keeps_no_head(kv, conversations):
    conversation = conversations.create("m")
    conversations.trash(conversation.id)
    kv.save(conversation.id, exported_kv(tokens(1, 6)))
    assert kv.index.heads_of(conversation.id) == {} and kv.index.references() == {}



# ---- evictions racing a save ------------------------------------------------------------------


def test_a_save_whose_earlier_blocks_were_evicted_meanwhile_leaves_no_broken_chain(kv, conversations):
    """The chat asks first_missing, then hands the writer only the blocks from there on; if the cap (another
    conversation's save) evicts the block before them in between, they cannot hang under it."""
    conversation = conversations.create("m")
    first = tokens(1, 12)
    kv.save(conversation.id, exported_kv(first))
    longer = first + tokens(400, 6)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    assert start == 3
    kv.remove([keys_of(first)[2]])  # what the cap does to the chain's end
    kv.save(conversation.id, exported_kv(longer, first_block=start))
    check_index_matches_files(kv)
    check_heads_loadable(kv, conversation.id)
    assert set(kv.index.references()) >= set(keys_of(first)[:2])
    assert_loads(kv, longer, 2)
    # The next turn starts from the gap and completes the chain.
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    assert start == 2
    kv.save(conversation.id, exported_kv(longer, first_block=start))
    assert_loads(kv, longer, 5)
    check_heads_loadable(kv, conversation.id)


def test_a_chain_another_kvchat_evicted_part_of_before_the_commit_gets_no_head(kv, conversations, monkeypatch):
    """The same race across processes, after save's own check: the commit's transaction checks that every
    block of the chain is in the index before it names the chain as the conversation's."""
    conversation = conversations.create("m")
    first = tokens(1, 12)
    kv.save(conversation.id, exported_kv(first))
    heads_before = kv.index.heads_of(conversation.id)
    longer = first + tokens(400, 6)
    start = kv.first_missing(FINGERPRINT, BLOCK_SIZE, longer)
    commit = kv.index.commit

    def evicted_first(*args, **kwargs):  # another process's eviction lands between the files and the commit
        kv.index.remove([keys_of(first)[1]])
        return commit(*args, **kwargs)

    monkeypatch.setattr(kv.index, "commit", evicted_first)
    kv.save(conversation.id, exported_kv(longer, first_block=start))
    heads = kv.index.heads_of(conversation.id)
    assert keys_of(longer)[-1] not in heads  # the chain past the gap is not the conversation's
    assert set(heads) == {keys_of(first)[0]} and heads != heads_before  # what is left of the old chain
    check_heads_loadable(kv, conversation.id)
    assert_loads(kv, longer, 1)
