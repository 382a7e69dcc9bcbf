"""SpareBuffers: the contiguous K/V buffers of requests that ended, kept for the next requests.

A fresh buffer costs its page faults again (~60 ms for 2k tokens of SmolLM2 in fp32), and a chat's next
turn starts with exactly the positions its last one left, so those need no gather from the pool. Several
buffers are kept, as many as requests run at once: a server's conversations each find their own (the
buffer whose positions share the longest prefix with the prompt), and a burst of concurrent requests does
not allocate again. What they hold together beyond the largest stays within a budget (the prefix cache's
pool size), so a burst of long requests does not keep their peak for good; the oldest go first.
Used by the contiguous and working-copy strategies; called under the engine's lock."""

from __future__ import annotations

from collections.abc import Callable

from engine.kv.cache import ContiguousKVCache
from engine.kv.prefix_cache import common_prefix_length

HEADROOM = 256  # tokens of reply a request's buffer has room for up front, so prefill never regrows it


def _bytes(buffer: ContiguousKVCache) -> int:
    return sum(t.nbytes for t in buffer.storage())


class SpareBuffers:
    def __init__(self, new_buffer: Callable[[], ContiguousKVCache], context_window: int, most: int = 1,
                 budget_bytes: int = 0):
        """`most`: buffers kept at most; `budget_bytes`: what they may hold beyond the largest one."""
        self._new_buffer = new_buffer
        self._context_window = context_window
        self._most, self._budget = max(1, most), budget_bytes
        self._kept: list[tuple[ContiguousKVCache, list[int]]] = []  # (buffer, the ids its positions hold), oldest first

    def take(self, prompt_ids: list[int]) -> tuple[ContiguousKVCache, int]:
        """A buffer for the prompt, and how many of its leading positions already hold it: the kept one that
        shares most of the prompt (the largest among equals, which regrows least), else a new one."""
        if self._kept:
            valid, _, best = max((common_prefix_length(held, prompt_ids), kept.capacity, i)
                                 for i, (kept, held) in enumerate(self._kept))
            buffer, _ = self._kept.pop(best)
        else:
            buffer, valid = self._new_buffer(), 0
        buffer.truncate(valid)
        buffer.reserve(min(self._context_window, len(prompt_ids) + HEADROOM) - valid)
        return buffer, valid

    def give(self, buffer: ContiguousKVCache, tokens: list[int]) -> None:
        """Keep `buffer`, whose leading positions hold `tokens`; the oldest kept go while there are too many
        or they hold more than the budget beyond the largest."""
        self._kept.append((buffer, list(tokens[: buffer.num_tokens])))
        while len(self._kept) > 1:
            sizes = [_bytes(kept) for kept, _ in self._kept]
            if len(self._kept) <= self._most and sum(sizes) - max(sizes) <= self._budget:
                return
            largest = sizes.index(max(sizes))
            self._kept.pop(1 if largest == 0 else 0)  # the oldest, unless it is the largest
