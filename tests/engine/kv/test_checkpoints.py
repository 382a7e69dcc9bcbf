"""State checkpoints in the prefix cache (kv/checkpoints.py), with a toy recurrent state: a number that every
token changes, so a state is right only if it was computed from exactly the tokens before it.

A hybrid model's cached prefix must end where a checkpoint was taken; these tests drive requests through
WorkingCopyKV the way the runner does (stopping the forward at each `checkpoints_between` position) and check
where later matches start, what state they start from, and that memory and invariants hold."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.cache import ContiguousKVCache
from engine.kv.checkpoints import CHECKPOINT_EVERY, wanted_positions
from tests.engine.kv.toy_chat import (CPU, DIM, HEADS, LAYERS, chat_turn, forward, make_cache, new_state,
                                      open_request, toy_state)


def test_a_follow_up_starts_where_the_last_reply_ended_with_the_state_computed_there():
    cache = make_cache()
    prompt, reply = list(range(10)), [50, 51, 52]
    chat_turn(cache, prompt, reply)
    follow_up = [*prompt, *reply, 60, 61, 62]
    match = cache.match(follow_up)
    assert match.cached_tokens == len(prompt) + len(reply)
    assert float(match.state.layer(0).conv) == toy_state(follow_up[: match.cached_tokens])
    assert match.state.position == match.cached_tokens
    cache.release(match.owned, match.shared)


def test_the_same_prompt_again_starts_one_token_before_its_end():
    cache = make_cache()
    prompt = list(range(11))
    chat_turn(cache, prompt, [70, 71])
    match = cache.match(prompt)  # a regenerated reply
    assert match.cached_tokens == len(prompt) - 1
    assert float(match.state.layer(0).conv) == toy_state(prompt[:-1])
    cache.release(match.owned, match.shared)


def test_a_match_past_the_last_checkpoint_is_cut_back_to_it_and_says_how_much_is_recomputed():
    cache = make_cache()
    prompt = list(range(9))
    chat_turn(cache, prompt, [80, 81, 82, 83])
    # An edit after token 11: the K/V of 12 tokens are cached, the nearest checkpoint is at the prompt's end - 1.
    edited = [*prompt, 80, 81, 82, 99, 98]
    match = cache.match(edited)
    assert match.cached_tokens == len(prompt) - 1
    assert match.recomputed == 12 - (len(prompt) - 1)
    assert float(match.state.layer(0).conv) == toy_state(edited[: match.cached_tokens])
    cache.release(match.owned, match.shared)


def test_without_any_checkpoint_nothing_is_reused():
    cache = make_cache()
    kv = open_request(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    forward(kv, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # not stopping at the prompt's checkpoint: none is taken
    kv.finalize([1, 2, 3, 4, 5, 6, 7, 8, 9])
    kv.state.position = -1  # nor at close
    kv.close()
    match = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (match.cached_tokens, match.state, match.recomputed) == (0, None, 9)


def test_a_long_prompt_leaves_checkpoints_every_so_many_tokens():
    assert wanted_positions(3 * CHECKPOINT_EVERY + 5) == {CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY,
                                                          3 * CHECKPOINT_EVERY, 3 * CHECKPOINT_EVERY + 4}
    assert wanted_positions(1) == set()


def test_a_partial_block_superseded_by_a_longer_one_hands_its_checkpoint_over():
    cache = make_cache()
    prompt = list(range(6))  # ends mid-block: its reply's last checkpoint is on a partial node
    chat_turn(cache, prompt, [40])
    chat_turn(cache, [*prompt, 40, 41, 42, 43, 44], [45])  # completes that block: the partial node goes
    match = cache.match([*prompt, 40, 77])
    assert match.cached_tokens == len(prompt) + 1
    assert float(match.state.layer(0).conv) == toy_state([*prompt, 40])
    cache.release(match.owned, match.shared)


def test_checkpoints_keep_to_their_budget_dropping_the_least_recently_used():
    one = new_state().nbytes
    cache = make_cache(budget=3 * one)
    for first in range(5):  # five conversations, two checkpoints each
        chat_turn(cache, [100 * first + i for i in range(7)], [100 * first + 50])
    assert cache.checkpoints.nbytes <= 3 * one
    latest = cache.match([400 + i for i in range(7)] + [450, 1])
    assert latest.cached_tokens == 8, "the newest conversation lost its checkpoint"
    cache.release(latest.owned, latest.shared)
    oldest = cache.match([i for i in range(7)] + [50, 1])
    assert oldest.cached_tokens == 0 and oldest.recomputed == 8
    cache.release(oldest.owned, oldest.shared)


def test_evicted_blocks_take_their_checkpoints_with_them():
    cache = make_cache(blocks=6)
    chat_turn(cache, list(range(9)), [50])
    chat_turn(cache, list(range(200, 223)), [250])  # needs every block: the first conversation is evicted
    assert all(n.tokens[0] >= 200 for n in cache.nodes()) and any(n.checkpoints for n in cache.nodes())
    assert cache.checkpoints.nbytes == sum(s.nbytes for n in cache.nodes() for s in n.checkpoints.values())


def test_the_invariants_catch_a_checkpoint_filed_at_the_wrong_position():
    cache = make_cache()
    chat_turn(cache, list(range(9)), [50])
    node = next(n for n in cache.nodes() if n.checkpoints)
    offset = next(iter(node.checkpoints))
    node.checkpoints[offset].position += 1
    with pytest.raises(AssertionError, match="another position"):
        cache.check_invariants()


def test_a_cut_or_filled_cache_refuses_its_stale_state_until_a_checkpoint_is_loaded():
    working = ContiguousKVCache(LAYERS, HEADS, DIM, 64, CPU, torch.float32, new_state())
    working.reserve(3)
    working.commit(3)
    assert working.state.position == 3
    working.truncate(2)
    with pytest.raises(RuntimeError, match="recurrent state"):
        working.layer_state(0)
    working.truncate(0)
    assert working.layer_state(0).conv.abs().sum() == 0  # cut to nothing: the zero state is right


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=9),
                          st.lists(st.integers(0, 5), min_size=0, max_size=6)), min_size=1, max_size=8))
def test_random_chats_always_start_from_the_state_of_exactly_their_cached_tokens(turns):
    """Conversations that branch and repeat (tiny vocabulary) on a small evicting pool and budget: every
    match starts from the state of exactly the tokens it reuses (chat_turn checks it), invariants hold."""
    cache = make_cache(blocks=12, budget=4 * new_state().nbytes)
    history: list[int] = []
    for message, reply in turns:
        prompt = [*history, *message] if len(history) < 20 else message
        chat_turn(cache, prompt, reply)
        history = [*prompt, *reply]
