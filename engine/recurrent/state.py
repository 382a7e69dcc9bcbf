"""SequenceState: the recurrent layers' state of one sequence (or one per row of a batch), at one position.

An attention layer's product is K/V per token, kept in blocks and cut at any position. A recurrent layer's
product is a state of fixed size that summarises every token before it: it cannot be cut, only copied where
it was computed. So a state knows the position it summarises (`position`, the tokens before it), a copy of
it is a checkpoint (`copy`), and going back to an earlier position means loading a checkpoint taken there
(`load`). The layers update their LayerState in place, so the tensors of a state never move (a captured
decode step reads them where they are).

A forward may also `record` the state after some of its tokens (each layer's `trail`): after every one for a
speculative step, which may keep only some of its tokens (`rewind` goes back to the last kept one when the
rejected drafts are cut, kv/cache.py's truncate); after given positions inside a prefill, where the prefix
cache wants checkpoints (`recorded` copies one out), so the forward need not stop there. The next forward
forgets the trail.

Per recurrent layer: `conv`, the last kernel - 1 inputs of the layer's causal convolution, in the model's
dtype (the convolution reads them as its left padding); `recurrent`, a Gated DeltaNet layer's
[value heads, key dim, value dim] matrix in fp32 (transformers keeps it in fp32 too), None for a
short-convolution layer. A fresh state is zeros: the convolution's zero padding and an empty memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config.hybrid import HybridLayers

STALE = -1  # the position of a state whose tensors no longer match any position (a cut or filled cache)


@dataclass
class LayerState:
    conv: torch.Tensor  # [channels, kernel - 1], or [rows, channels, kernel - 1] for a batch
    recurrent: torch.Tensor | None  # [value heads, key dim, value dim] (a leading rows dim for a batch), fp32
    # While the state records: the layer's state after the recorded tokens of the forward, in order (copies),
    # and which tokens those are: indices in the forward's tokens (None: every token).
    trail: list["LayerState"] | None = None
    record_after: tuple[int, ...] | None = None


class SequenceState:
    def __init__(self, layers: dict[int, LayerState], position: int = 0):
        self.layers = layers
        self.position = position  # tokens this state summarises
        self._trail_from: int | None = None  # where the recorded forward started (None: not recording)
        self._trail_at: tuple[int, ...] | None = None  # the positions recorded (None: every token)

    @classmethod
    def zeros(cls, layout: HybridLayers, device: torch.device, dtype: torch.dtype,
              rows: int | None = None) -> "SequenceState":
        lead = () if rows is None else (rows,)
        layers = {}
        for i in layout.recurrent_layers:
            shape = layout.recurrent_shape(i)
            layers[i] = LayerState(torch.zeros(*lead, *layout.conv_shape(), device=device, dtype=dtype),
                                   None if shape is None else
                                   torch.zeros(*lead, *shape, device=device, dtype=torch.float32))
        return cls(layers)

    def layer(self, index: int) -> LayerState:
        return self.layers[index]

    def _tensors(self):
        for state in self.layers.values():
            yield state.conv
            if state.recurrent is not None:
                yield state.recurrent

    def tensors(self) -> list[torch.Tensor]:
        """This state's tensors in a fixed order: per recurrent layer, first to last, its convolution state,
        then its recurrent matrix if it has one. A checkpoint leaves the engine in this order (kv/exported.py)
        and comes back in it (`with_tensors`)."""
        return list(self._tensors())

    def with_tensors(self, tensors: Sequence[torch.Tensor], position: int) -> "SequenceState | None":
        """A new state shaped like this one (its layers, shapes, dtypes and device) holding a copy of `tensors`
        (in `tensors()` order, on any device), at `position`; None when they do not fit: another model's."""
        mine = self.tensors()
        if len(tensors) != len(mine) or any(t.shape != m.shape or t.dtype != m.dtype for t, m in zip(tensors, mine)):
            return None
        copies = iter([t.to(device=m.device, copy=True) for t, m in zip(tensors, mine)])
        return SequenceState({i: LayerState(next(copies), None if s.recurrent is None else next(copies))
                              for i, s in self.layers.items()}, position)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def copy(self, device: torch.device | None = None) -> "SequenceState":
        """A checkpoint: this state's tensors copied (to `device`, default theirs), at this position."""
        return SequenceState({i: LayerState(s.conv.to(device=device, copy=True),
                                            None if s.recurrent is None else s.recurrent.to(device=device, copy=True))
                              for i, s in self.layers.items()}, self.position)

    def load(self, other: "SequenceState") -> None:
        """Become `other` (a checkpoint of the same model), in place."""
        if other.layers.keys() != self.layers.keys():
            raise ValueError("a checkpoint of another model's layers")
        for mine, theirs in zip(self._tensors(), other._tensors()):
            mine.copy_(theirs)
        self.position = other.position

    def reset(self) -> None:
        """The state before any token."""
        for t in self._tensors():
            t.zero_()
        self.position = 0

    def record(self, after: "tuple[int, ...] | None" = None) -> None:
        """Keep the state after tokens of the next forward: after each one (None: a draft verification, for
        `rewind`), or after the positions `after` (checkpoints inside a prefill, for `recorded`)."""
        self._trail_from, self._trail_at = self.position, after
        indices = None if after is None else tuple(p - self.position - 1 for p in after)
        for state in self.layers.values():
            state.trail, state.record_after = [], indices

    def forget_trail(self) -> None:
        self._trail_from = self._trail_at = None
        for state in self.layers.values():
            state.trail = state.record_after = None

    def _trail_index(self, position: int) -> int | None:
        """Where the state after `position` is in every layer's trail; None when it was not recorded."""
        start = self._trail_from
        if start is None or not start < position <= self.position:
            return None
        index = position - start - 1 if self._trail_at is None else (
            self._trail_at.index(position) if position in self._trail_at else None)
        if index is None or any(s.trail is None or len(s.trail) <= index for s in self.layers.values()):
            return None  # a layer that did not record it: nothing to go back to
        return index

    def recorded(self, position: int) -> "SequenceState | None":
        """The state after `position` as the last forward recorded it (a checkpoint of its own), or None."""
        index = self._trail_index(position)
        if index is None:
            return None
        return SequenceState({i: LayerState(s.trail[index].conv, s.trail[index].recurrent)
                              for i, s in self.layers.items()}, position)

    def rewind(self, position: int) -> bool:
        """Go back to `position`, after one of the recorded forward's tokens; False when it was not recorded."""
        kept = self.recorded(position)
        if kept is None:
            return False
        self.load(kept)
        self.forget_trail()
        return True

    def row(self, index: int) -> "SequenceState":
        """Row `index` of a batch's state, as views (writing them writes the batch)."""
        return SequenceState({i: LayerState(s.conv[index], None if s.recurrent is None else s.recurrent[index])
                              for i, s in self.layers.items()}, self.position)
