"""PrefixCache on a tiny pool: exact matching, sharing, copy-on-write, eviction order, tiers, invariants."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.cache import ContiguousKVCache
from engine.kv.pool import KVPool
from engine.kv.prefix_cache import KVCacheFullError, PrefixCache
from engine.kv.working_copy import WorkingCopyKV
from tests.examples import examples

LAYERS, HEADS, DIM, SIZE = 2, 1, 2, 4
CPU = torch.device("cpu")


def make_cache(blocks=32, host_blocks=0) -> PrefixCache:
    pool = KVPool(blocks, SIZE, LAYERS, HEADS, DIM, CPU, torch.float32)
    host = KVPool(host_blocks, SIZE, LAYERS, HEADS, DIM, CPU, torch.float32) if host_blocks else None
    return PrefixCache(pool, host)


def kv_value(token: int, position: int, layer: int) -> float:
    return token * 1000.0 + position + layer / 10


def exported_blocks(tokens: list[int]) -> torch.Tensor:
    """K/V of `tokens` laid out as PrefixCache.export returns them (what `compute` would have written)."""
    blocks = torch.zeros(-(-len(tokens) // SIZE), 2, LAYERS, HEADS, SIZE, DIM)
    for i, t in enumerate(tokens):
        for layer in range(LAYERS):
            blocks[i // SIZE, 0, layer, :, i % SIZE] = kv_value(t, i, layer)
            blocks[i // SIZE, 1, layer, :, i % SIZE] = -kv_value(t, i, layer)
    return blocks


def load_blocks(cache: PrefixCache, tokens: list[int]) -> int:
    """File the K/V of `tokens` as the block store does (PrefixCache.import_blocks), from `exported_blocks`."""
    blocks = exported_blocks(tokens)

    def fill(first: int, dests: list[torch.Tensor]) -> int:
        for i, dest in enumerate(dests):
            dest.copy_(blocks[first + i])
        return len(dests)

    return cache.import_blocks(tokens, fill)


def open_request(cache: PrefixCache, prompt: list[int], publish: bool = True) -> WorkingCopyKV:
    working = ContiguousKVCache(LAYERS, HEADS, DIM, 4096, CPU, torch.float32)
    return WorkingCopyKV(cache, working, cache.match(prompt), prompt, publish)


def compute(kv: WorkingCopyKV, tokens: list[int]) -> None:
    """Write K/V for tokens[kv.num_tokens:] the way a forward pass would."""
    start, new = kv.num_tokens, tokens[kv.num_tokens :]
    if not new:
        return
    kv.reserve(len(new))
    for layer in range(LAYERS):
        values = torch.tensor([[kv_value(t, start + i, layer)] * DIM for i, t in enumerate(new)])
        kv.working.write(layer, values[None], -values[None])
    kv.commit(len(new))
    kv.finalize(new)


def serve(cache: PrefixCache, tokens: list[int], prompt_len: int | None = None, keep: bool = True) -> None:
    """A whole request: match the prompt, compute the rest of `tokens`, and cache it (or not)."""
    kv = open_request(cache, tokens[: prompt_len or len(tokens)], publish=keep)
    try:
        assert_holds(kv, tokens[: kv.num_tokens])
        compute(kv, tokens)
    finally:
        kv.close()


def assert_holds(kv: WorkingCopyKV, tokens: list[int]) -> None:
    """The working copy holds exactly the K/V of `tokens` at their positions."""
    k, v = kv.working.positions(0, len(tokens))
    for layer in range(LAYERS):
        expected = torch.tensor([kv_value(t, i, layer) for i, t in enumerate(tokens)])
        assert torch.equal(k[layer, 0, :, 0], expected)
        assert torch.equal(v[layer, 0, :, 0], -expected)


def test_an_empty_cache_matches_nothing():
    cache = make_cache()
    match = cache.match([1, 2, 3])
    assert (match.cached_tokens, match.source, match.blocks) == (0, "none", [])


def test_a_follow_up_reuses_everything_before_its_new_tokens():
    cache = make_cache()
    history = list(range(100, 110))  # 2 full blocks + 2 tokens
    serve(cache, history)
    kv = open_request(cache, history + [7, 8, 9])
    assert kv.num_tokens == 10 and kv.working.num_tokens == 10
    assert_holds(kv, history)


def test_matching_is_exact_to_the_token_not_rounded_to_a_block():
    cache = make_cache()
    serve(cache, list(range(100, 112)))
    kv = open_request(cache, list(range(100, 107)) + [55, 56])  # diverges inside the second block
    assert kv.num_tokens == 7
    assert_holds(kv, list(range(100, 107)))


def test_a_full_hit_still_computes_the_last_token():
    cache = make_cache()
    tokens = list(range(100, 108))  # exactly two blocks
    serve(cache, tokens)
    assert open_request(cache, tokens).num_tokens == 7


def test_a_lent_partial_block_is_copied_not_shared():
    cache = make_cache()
    serve(cache, list(range(100, 106)))  # block [100..103] + partial [104, 105]
    kv = open_request(cache, [100, 101, 102, 103, 104, 77, 78])
    assert kv.num_tokens == 5
    partial = next(n for n in cache.nodes() if n.tokens == (104, 105))
    assert kv.blocks[1] != partial.block and kv.blocks[1] in kv.owned
    compute(kv, [100, 101, 102, 103, 104, 77, 78])
    # the lender's own block still holds its tokens
    assert cache.pool.data[partial.block, 0, 0, 0, 1, 0].item() == kv_value(105, 5, 0)
    kv.close()
    cache.check_invariants()


def test_conversations_sharing_a_system_prompt_share_its_blocks():
    cache = make_cache()
    system = list(range(200, 208))  # two blocks
    serve(cache, system + [1, 2, 3, 4, 5])
    used_after_first = cache.pool.num_blocks - cache.pool.num_free
    serve(cache, system + [9, 9, 9, 9, 9])
    used_after_second = cache.pool.num_blocks - cache.pool.num_free
    assert used_after_second - used_after_first == 2  # only the new tail's blocks
    first_level = list(cache.root.children.values())
    assert len(first_level) == 1 and len(first_level[0].children) == 1  # one chain for the system prompt


def test_a_regenerated_reply_and_an_edited_message_branch_from_the_shared_prefix():
    cache = make_cache()
    turn1 = list(range(300, 310))
    serve(cache, turn1 + [1, 1, 1, 1], prompt_len=10)
    regenerate = open_request(cache, turn1 + [2])
    assert regenerate.num_tokens == 10
    regenerate.close()
    edited = open_request(cache, turn1[:5] + [42, 43])
    assert edited.num_tokens == 5
    edited.close()
    cache.check_invariants()


def test_a_longer_block_supersedes_the_partial_block_it_extends():
    cache = make_cache()
    serve(cache, list(range(100, 106)))
    serve(cache, list(range(100, 109)))
    tokens = sorted(n.tokens for n in cache.nodes())
    assert tokens == [(100, 101, 102, 103), (104, 105, 106, 107), (108,)]
    assert cache.pool.num_blocks - cache.pool.num_free == 3


def test_scripted_eviction_order_is_exact():
    cache = make_cache(blocks=5)
    serve(cache, [1, 1, 1, 1, 2, 2, 2, 2])  # A: blocks a1 -> a2
    serve(cache, [3, 3, 3, 3])  # B
    serve(cache, [5, 5, 5, 5])  # C
    open_request(cache, [1, 1, 1, 1, 2, 2, 2, 2, 0]).close()  # touch A: B is now least recent
    evicted = []
    cache.allocate(1)  # the one free block, no eviction
    for _ in range(4):
        before = {n.tokens for n in cache.nodes()}
        cache.allocate(1)
        evicted.append((before - {n.tokens for n in cache.nodes()}).pop())
    assert evicted == [(3, 3, 3, 3), (5, 5, 5, 5), (2, 2, 2, 2), (1, 1, 1, 1)]


def test_blocks_of_a_running_request_are_never_evicted():
    cache = make_cache(blocks=4)
    serve(cache, [1, 1, 1, 1, 2, 2, 2, 2])
    running = open_request(cache, [1, 1, 1, 1, 2, 2, 2, 2, 9])  # references both blocks
    cache.allocate(2)  # the two free blocks
    with pytest.raises(KVCacheFullError, match="KV cache is full"):
        cache.allocate(1)
    assert len(list(cache.nodes())) == 2
    running.close()
    cache.allocate(1)  # now the least recently used leaf can go


def test_with_a_host_tier_evicted_blocks_spill_and_come_back_on_a_hit():
    cache = make_cache(blocks=3, host_blocks=8)
    a = [1, 1, 1, 1, 2, 2, 2, 2]
    serve(cache, a)
    serve(cache, [3, 3, 3, 3, 4, 4, 4, 4])  # needs A's device blocks: A spills to the host tier
    assert {n.tokens for n in cache.nodes() if n.host_block is not None} >= {(2, 2, 2, 2)}
    kv = open_request(cache, a + [0])
    assert kv.num_tokens == 8
    assert_holds(kv, a)
    kv.close()
    cache.check_invariants()


def test_a_host_hit_reports_host_as_the_source():
    cache = make_cache(blocks=2, host_blocks=4)
    serve(cache, [1, 1, 1, 1])
    serve(cache, [3, 3, 3, 3, 4, 4, 4, 4])
    match = cache.match([1, 1, 1, 1, 0])
    assert (match.cached_tokens, match.source) == (4, "host")
    cache.release(match.owned, match.shared)
    cache.check_invariants()


def test_a_request_larger_than_the_pool_fails_alone_and_the_cache_stays_usable():
    cache = make_cache(blocks=3)
    serve(cache, [1, 1, 1, 1])
    with pytest.raises(KVCacheFullError):
        serve(cache, list(range(40)))
    cache.check_invariants()
    serve(cache, [7, 7, 7, 7, 7])


def test_stats_count_blocks_bytes_and_hit_rate():
    cache = make_cache(blocks=10)
    serve(cache, [1, 2, 3, 4, 5, 6])
    open_request(cache, [1, 2, 3, 4, 5, 6, 7, 8]).close()
    stats = cache.stats()
    assert stats["blocks_total"] == 10 and stats["blocks_used"] == 2 and stats["cached_blocks"] == 2
    assert stats["bytes_used"] == 2 * cache.pool.nbytes_per_block
    assert stats["hit_rate"] == round(6 / (6 + 8), 4)


operation = st.one_of(
    st.tuples(st.just("serve"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
    st.tuples(st.just("abandon"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
    st.tuples(st.just("start"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
    st.tuples(st.just("end"), st.integers(0, 3)),
    st.tuples(st.just("allocate"), st.integers(1, 3)),
    st.tuples(st.just("load"), st.lists(st.integers(0, 3), min_size=1, max_size=14)),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(operation, min_size=1, max_size=25), st.sampled_from([0, 6]))
def test_invariants_hold_after_every_operation(operations, host_blocks):
    """Every block is free, in one node or owned by one request; refs never go negative; data stays right.

    "start" leaves a request running (its completed blocks already in the tree) until an "end".
    """
    cache = make_cache(blocks=8, host_blocks=host_blocks)
    held: list[list[int]] = []
    running: list[WorkingCopyKV] = []
    for op, arg in operations:
        try:
            if op in ("serve", "abandon"):
                serve(cache, arg, keep=op == "serve")
            elif op == "start":
                kv = open_request(cache, arg)
                running.append(kv)
                assert_holds(kv, arg[: kv.num_tokens])
                compute(kv, arg)
                assert_holds(kv, arg)
            elif op == "end" and running:
                running.pop(arg % len(running)).close()
            elif op == "allocate":
                held.append(cache.allocate(arg))
            elif op == "load":
                load_blocks(cache, arg)
        except KVCacheFullError:
            pass
        live = {b for blocks in held for b in blocks} | {b for kv in running for b in kv.owned}
        cache.check_invariants(live)
        referenced = sum(len(kv.chain) for kv in running)
        assert sum(n.refs for n in cache.nodes()) == referenced


def test_completed_blocks_join_the_tree_while_their_request_still_runs():
    cache = make_cache()
    tokens = list(range(100, 110))
    running = open_request(cache, tokens)
    compute(running, tokens)  # 2 full blocks + 2 tokens, request not finished
    concurrent = open_request(cache, tokens + [5])
    assert concurrent.num_tokens == 8  # the full blocks are shared already; the partial one joins at the end
    assert concurrent.blocks[:2] == running.blocks[:2]
    concurrent.close()
    running.close()
    assert open_request(cache, tokens + [5]).num_tokens == 10


def test_export_copies_the_cached_prefix_exactly_and_zeroes_the_rest():
    cache = make_cache()
    serve(cache, [1, 2, 3, 4, 5, 6, 7])
    serve(cache, [1, 2, 3, 4, 5, 9, 9, 9, 9])  # a sibling lends 5, then diverges
    length, blocks = cache.export([1, 2, 3, 4, 5, 6, 8, 8])
    assert length == 6
    assert torch.equal(blocks, exported_blocks([1, 2, 3, 4, 5, 6]))
    assert cache.export([8, 8]) is None


def test_loaded_blocks_are_matched_as_disk_once_then_as_device():
    cache = make_cache()
    tokens = list(range(10, 21))  # 2 full blocks and a partial one
    assert load_blocks(cache, tokens) == len(tokens)
    kv = open_request(cache, tokens + [99])
    assert (kv.num_tokens, cache.match(tokens + [98]).source) == (11, "device")
    assert_holds(kv, tokens)
    kv.close()
    fresh = make_cache()
    load_blocks(fresh, tokens)
    match = fresh.match(tokens + [99])
    assert (match.cached_tokens, match.source) == (11, "disk")


def test_load_keeps_what_the_tree_holds_and_adds_only_the_rest():
    cache = make_cache()
    serve(cache, [1, 1, 1, 1, 2, 2])
    before = {n.tokens: n.block for n in cache.nodes()}
    added = load_blocks(cache, [1, 1, 1, 1, 2, 2, 2, 2, 3])
    assert added == 5
    after = {n.tokens: n.block for n in cache.nodes()}
    assert after[(1, 1, 1, 1)] == before[(1, 1, 1, 1)]
    assert (2, 2) not in after  # the longer block supersedes the partial one
    assert load_blocks(cache, [1, 1, 1, 1, 2]) == 0
    cache.check_invariants()


def test_load_below_a_spilled_block_brings_the_path_back_to_the_device():
    cache = make_cache(blocks=3, host_blocks=8)
    serve(cache, [1, 1, 1, 1, 2, 2, 2, 2])
    serve(cache, [3, 3, 3, 3, 4, 4, 4, 4])  # spills the first sequence
    tokens = [1, 1, 1, 1, 2, 2, 2, 2, 5]
    load_blocks(cache, tokens)
    cache.check_invariants()
    assert all(n.block is not None for n in cache.nodes() if n.tokens[0] in (1, 2, 5))
    length, blocks = cache.export(tokens)
    assert length == len(tokens) and torch.equal(blocks, exported_blocks(tokens))


def test_loading_more_blocks_than_the_pool_holds_is_refused_and_the_cache_stays_usable():
    cache = make_cache(blocks=2)
    tokens = list(range(12))
    with pytest.raises(KVCacheFullError):
        load_blocks(cache, tokens)
    cache.check_invariants()
    assert list(cache.nodes()) == []
    serve(cache, [7, 7, 7, 7, 7])
