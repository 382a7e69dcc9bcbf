"""SpareBuffers: each conversation's next turn finds the buffer holding its positions; what is kept stays
within the count and the byte budget, the largest buffer always kept."""

import torch

from engine.kv.cache import ContiguousKVCache
from engine.kv.spare_buffers import HEADROOM, SpareBuffers

WINDOW = 4096
made: list[ContiguousKVCache] = []


def new_buffer() -> ContiguousKVCache:
    buffer = ContiguousKVCache(2, 1, 4, WINDOW, torch.device("cpu"), torch.float32)
    made.append(buffer)
    return buffer


def filled(spares: SpareBuffers, tokens: list[int]) -> ContiguousKVCache:
    """A request over `tokens`: its buffer taken, every position computed, given back."""
    buffer, valid = spares.take(tokens)
    buffer.reserve(len(tokens) - valid)
    buffer.commit(len(tokens) - valid)
    spares.give(buffer, tokens)
    return buffer


def test_concurrent_conversations_each_find_their_own_buffer():
    made.clear()
    spares = SpareBuffers(new_buffer, WINDOW, most=4, budget_bytes=1 << 30)
    a, b = list(range(10, 50)), list(range(60, 90))
    first_a, valid_a = spares.take(a)
    first_b, _ = spares.take(b)  # at the same time: a buffer of its own
    for buffer, tokens in ((first_a, a), (first_b, b)):
        buffer.reserve(len(tokens))
        buffer.commit(len(tokens))
    spares.give(first_a, a)
    spares.give(first_b, b)
    assert valid_a == 0 and len(made) == 2
    # Each follow-up (taken in either order) gets the buffer with its own positions, all of them reused.
    buffer, valid = spares.take(b + [1, 2])
    assert buffer is first_b and valid == len(b)
    buffer, valid = spares.take(a + [3])
    assert buffer is first_a and valid == len(a)
    assert len(made) == 2


def test_one_at_a_time_reuses_one_buffer():
    made.clear()
    spares = SpareBuffers(new_buffer, WINDOW, most=8, budget_bytes=1 << 30)
    for start in range(0, 500, 100):
        filled(spares, list(range(start, start + 50)))
    assert len(made) == 1


def test_the_oldest_go_beyond_the_count_and_the_budget_the_largest_stays():
    made.clear()
    spares = SpareBuffers(new_buffer, WINDOW, most=2, budget_bytes=1 << 30)
    taken = [spares.take(list(range(s, s + 20)))[0] for s in (0, 100, 200)]
    for buffer, s in zip(taken, (0, 100, 200)):
        spares.give(buffer, list(range(s, s + 20)))
    assert spares.take(list(range(0, 20)))[1] == 0  # the oldest (same size as the others) went
    # A budget of nothing beyond the largest: one buffer stays, the largest, even when it is the oldest.
    made.clear()
    tight = SpareBuffers(new_buffer, WINDOW, most=8, budget_bytes=0)
    big, _ = tight.take(list(range(3000)))
    small, _ = tight.take(list(range(5000, 5010)))
    assert big.capacity > small.capacity >= 10 + HEADROOM
    tight.give(big, [])
    tight.give(small, [])
    assert tight.take([7])[0] is big and tight.take([7])[0] is not small  # small was dropped: a new one
