"""SpareBuffer: the last request's contiguous K/V buffer, kept for the next request.

A fresh buffer costs its page faults again (~60 ms for 2k tokens of SmolLM2 in fp32), and a chat's
next turn starts with exactly the positions the last one left, so those need no gather from the pool.
Used by the contiguous and working-copy strategies; called under the engine's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kv.cache import ContiguousKVCache
from engine.kv.prefix_cache import common_prefix_length

HEADROOM = 256  # tokens of reply a request's buffer has room for up front, so prefill never regrows it


class SpareBuffer:
    def __init__(self, new_buffer: Callable[[], ContiguousKVCache], context_window: int):
        self._new_buffer = new_buffer
        self._context_window = context_window
        self._buffer: ContiguousKVCache | None = None
        self._tokens: list[int] = []  # the ids of the positions the kept buffer holds

    def take(self, prompt_ids: list[int]) -> tuple[ContiguousKVCache, int]:
        """A buffer for the prompt, and how many of its leading positions already hold it."""
        buffer, held = self._buffer, self._tokens
        self._buffer, self._tokens = None, []
        if buffer is None:
            buffer, held = self._new_buffer(), []
        valid = common_prefix_length(held, prompt_ids)
        buffer.truncate(valid)
        buffer.reserve(min(self._context_window, len(prompt_ids) + HEADROOM) - valid)
        return buffer, valid

    def give(self, buffer: ContiguousKVCache, tokens: list[int]) -> None:
        """Keep `buffer` (the larger of it and the one kept), whose leading positions hold `tokens`."""
        if self._buffer is None or buffer.capacity >= self._buffer.capacity:
            self._buffer = buffer
            self._tokens = list(tokens[: buffer.num_tokens])
