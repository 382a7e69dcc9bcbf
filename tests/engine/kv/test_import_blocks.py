"""Engine.import_blocks (K/V a reader fills straight into pool blocks) and Engine.prewarm, against the
plain paths: a resumed prompt answers exactly as one computed from scratch, reports `disk` once, and a
reader that stops early leaves only what it filled."""

from __future__ import annotations

from engine import SamplingParams
from engine.bench.fresh import with_fresh_cache

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def history_blocks(engine, tokens):
    list(engine.generate(tokens, SamplingParams(temperature=0, max_tokens=1), use_prefix_cache=True))
    exported = engine.export_kv(tokens)
    return exported


def filler(kv, calls):
    def fill(first, dests):
        calls.append((first, len(dests)))
        for i, dest in enumerate(dests):
            dest.copy_(kv[first + i])
        return len(dests)
    return fill


def test_blocks_filled_in_place_answer_as_a_recompute_and_report_disk_once(tiny_engine):
    tokens = list(range(5, 5 + 3 * tiny_engine.kv_block_size + 5))  # three full blocks and a partial one
    exported = history_blocks(tiny_engine, tokens)
    prompt = tokens + [7, 8, 9]
    expected = list(with_fresh_cache(tiny_engine).generate(prompt, PARAMS, use_prefix_cache=False))[-1]
    resumed, calls = with_fresh_cache(tiny_engine), []
    assert resumed.import_blocks(list(exported.token_ids), filler(exported.kv, calls)) == len(tokens)
    assert calls == [(0, 4)]
    first = list(resumed.generate(prompt, PARAMS))[-1]
    assert first.token_ids == expected.token_ids
    assert first.stats.cache_source == "disk" and first.stats.cached_tokens == len(tokens)
    again = list(resumed.generate(prompt, PARAMS))[-1]
    assert again.token_ids == expected.token_ids and again.stats.cache_source == "device"


def test_a_reader_that_stops_early_leaves_only_the_blocks_it_filled(tiny_engine):
    size = tiny_engine.kv_block_size
    tokens = list(range(40, 40 + 4 * size))
    exported = history_blocks(tiny_engine, tokens)
    resumed = with_fresh_cache(tiny_engine)
    free = resumed.prefix_cache.pool.num_free

    def two_then_damaged(first, dests):
        for i in range(2):
            dests[i].copy_(exported.kv[first + i])
        return 2

    assert resumed.import_blocks(list(exported.token_ids), two_then_damaged) == 2 * size
    assert resumed.cached_length(tokens + [1]) == 2 * size
    assert resumed.prefix_cache.pool.num_free == free - 2  # the blocks it did not fill went back
    resumed.prefix_cache.check_invariants()
    expected = list(with_fresh_cache(tiny_engine).generate(tokens + [1], PARAMS, use_prefix_cache=False))[-1]
    assert list(resumed.generate(tokens + [1], PARAMS))[-1].token_ids == expected.token_ids


def test_blocks_the_cache_holds_are_not_read_again(tiny_engine):
    size = tiny_engine.kv_block_size
    tokens = list(range(90, 90 + 3 * size))
    exported = history_blocks(tiny_engine, tokens)
    resumed, calls = with_fresh_cache(tiny_engine), []
    resumed.import_blocks(list(exported.token_ids[: size]), filler(exported.kv, calls))
    resumed.import_blocks(list(exported.token_ids), filler(exported.kv, calls))
    assert calls == [(0, 1), (1, 2)]


def test_prewarm_gathers_the_history_before_the_request_and_changes_nothing_it_answers(tiny_engine):
    tokens = list(range(200, 200 + 2 * tiny_engine.kv_block_size + 3))
    exported = history_blocks(tiny_engine, tokens)
    prompt = tokens + [11, 12]
    expected = list(with_fresh_cache(tiny_engine).generate(prompt, PARAMS, use_prefix_cache=False))[-1]
    resumed = with_fresh_cache(tiny_engine)
    resumed.import_blocks(list(exported.token_ids), filler(exported.kv, []))
    resumed.prewarm(tokens)
    gathered = []
    pool = resumed.prefix_cache.pool
    original = pool.read_into
    pool.read_into = lambda *args: (gathered.append(args[2] - args[1]), original(*args))[1]
    try:
        first = list(resumed.generate(prompt, PARAMS))[-1]
    finally:
        pool.read_into = original
    assert first.token_ids == expected.token_ids
    assert first.stats.cache_source == "disk"  # the prewarm is not a request: the first real one says disk
    assert sum(gathered) == 0  # the history was in the working copy already: nothing gathered from the pool
    assert resumed.cache_stats()["hit_rate"] == round(first.stats.cached_tokens / len(prompt), 4)


def test_prewarm_after_a_reply_reuses_the_buffer_that_reply_left(tiny_engine):
    """The chat opens a second conversation after a first one replied: the working buffer the step loop
    made (an inference tensor) is the one the prewarm fills."""
    engine = with_fresh_cache(tiny_engine)
    other = list(range(20, 20 + 2 * engine.kv_block_size))
    list(engine.generate(other, PARAMS))
    tokens = list(range(120, 120 + 2 * engine.kv_block_size + 1))
    list(engine.generate(tokens, SamplingParams(temperature=0, max_tokens=1)))
    engine.prewarm(other)
    expected = list(with_fresh_cache(tiny_engine).generate(other + [3], PARAMS, use_prefix_cache=False))[-1]
    assert list(engine.generate(other + [3], PARAMS))[-1].token_ids == expected.token_ids
