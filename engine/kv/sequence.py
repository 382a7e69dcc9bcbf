"""SequenceKV: the one contract for a request's K/V, whichever of the three strategies keeps it.

The strategy is chosen once per engine (engine/request/runner.py):
- ContiguousKV (kv/contiguous.py): no prefix cache; one growing buffer per request.
- WorkingCopyKV (kv/working_copy.py): the CPU default; pool blocks shared through the prefix cache,
  read through a contiguous working copy.
- PagedKV (kv/paged.py): the GPU default; pool blocks read in place by paged attention.

A forward pass over T new tokens is `reserve(T)`, then the model's `attention(...)` once per layer,
then `commit(T)`: the T positions are *computed*. They become *final* when `finalize(ids)` names
their tokens; the step loop finalises what it keeps.

Rules:
- Only final tokens are shared. A full block of final tokens joins the prefix cache's tree when
  `finalize` completes it (if the request publishes); the last, partial block of final tokens joins at
  `close`. Computed positions that are not final (the draft tokens of a speculative step) never
  enter the tree, so no other request and no export (`export` reads the tree) ever sees them.
- `truncate(n)` drops positions n.. ; only positions that are not final may go (n >= num_final).
- `num_final <= num_tokens`; `final_tokens` are the ids of positions 0..num_final.
- `close` gives everything back (final blocks to the tree or the pool, the rest to the pool);
  a closed sequence is not used again, and closing twice does nothing.
"""

from __future__ import annotations

from abc import abstractmethod

from engine.kv.cache import ContiguousKVCache, KVCache
from engine.recurrent.state import LayerState, SequenceState


class SequenceKV(KVCache):
    def __init__(self, cached_tokens: list[int]):
        self.final_tokens: list[int] = list(cached_tokens)  # ids of the final positions, in order
        self.recomputed = 0  # cached tokens past the last state checkpoint, computed again (kv/checkpoints.py)
        self.closed = False

    @property
    def num_final(self) -> int:
        return len(self.final_tokens)

    def finalize(self, token_ids: list[int]) -> None:
        """Name the tokens of the next len(token_ids) computed positions: they are final."""
        if self.num_final + len(token_ids) > self.num_tokens:
            raise ValueError(f"{self.num_final + len(token_ids)} final tokens, but only {self.num_tokens} computed")
        self.final_tokens += token_ids
        self._finalized()

    def _finalized(self) -> None:
        """Share what just became final (pooled strategies file full blocks); nothing by default."""

    @property
    def contiguous(self) -> ContiguousKVCache | None:
        """The one buffer attention reads, when the strategy keeps one (None: blocks read in place)."""
        return None

    @property
    def state(self) -> SequenceState | None:
        """A hybrid model's recurrent state after these tokens (kept with the contiguous buffer)."""
        return self.contiguous.state if self.contiguous is not None else None

    def layer_state(self, layer: int) -> LayerState:
        return self.contiguous.layer_state(layer)

    def checkpoints_between(self, start: int, end: int) -> list[int]:
        """Positions in (start, end] after which this request copies its recurrent state (a hybrid model's
        prompt: kv/checkpoints.py), so a forward over them stops there; none by default."""
        return []

    def take_checkpoint(self, position: int) -> None:
        """Keep the recurrent state after `position`, one of checkpoints_between's positions of the forward
        that just ran (which recorded it: recurrent/state.py)."""

    def truncate(self, num_tokens: int) -> None:
        """Drop the computed positions from `num_tokens` on; they must not be final."""
        if num_tokens < self.num_final:
            raise ValueError(f"cannot drop final positions: {self.num_final} are final, asked to keep {num_tokens}")
        if num_tokens < self.num_tokens:
            self._truncate(num_tokens)

    @abstractmethod
    def _truncate(self, num_tokens: int) -> None: ...

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._close()

    @abstractmethod
    def _close(self) -> None: ...
