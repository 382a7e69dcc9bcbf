"""SequenceState: the recurrent layers' state of one sequence (or one per row of a batch), at one position.

An attention layer's product is K/V per token, kept in blocks and cut at any position. A recurrent layer's
product is a state of fixed size that summarises every token before it: it cannot be cut, only copied where
it was computed. So a state knows the position it summarises (`position`, the tokens before it), a copy of
it is a checkpoint (`copy`), and going back to an earlier position means loading a checkpoint taken there
(`load`). The layers update their LayerState in place, so the tensors of a state never move (a captured
decode step reads them where they are).

A speculative step verifies several tokens in one forward and may keep only some of them. So while it runs,
the state `record`s: each layer also keeps its state after every one of those tokens (its `trail`), and
`rewind` goes back to any of them when the rejected drafts are cut (kv/cache.py's truncate); the next
forward forgets the trail.

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
    # While the state records: the layer's state after each new token of the forward, in order (copies).
    trail: list["LayerState"] | None = None


class SequenceState:
    def __init__(self, layers: dict[int, LayerState], position: int = 0):
        self.layers = layers
        self.position = position  # tokens this state summarises
        self._trail_from: int | None = None  # where the recorded forward started (None: not recording)

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

    def record(self) -> None:
        """Keep the state after each token of the next forward (a draft verification) for `rewind`."""
        self._trail_from = self.position
        for state in self.layers.values():
            state.trail = []

    def forget_trail(self) -> None:
        self._trail_from = None
        for state in self.layers.values():
            state.trail = None

    def rewind(self, position: int) -> bool:
        """Go back to `position`, after one of the recorded forward's tokens; False when it was not recorded."""
        start = self._trail_from
        if start is None or not start < position <= self.position:
            return False
        for state in self.layers.values():
            if state.trail is None or len(state.trail) != self.position - start:
                return False  # a layer that did not record (or not every token): nothing to go back to
        for state in self.layers.values():
            kept = state.trail[position - start - 1]
            state.conv.copy_(kept.conv)
            if state.recurrent is not None:
                state.recurrent.copy_(kept.recurrent)
        self.position = position
        self.forget_trail()
        return True

    def row(self, index: int) -> "SequenceState":
        """Row `index` of a batch's state, as views (writing them writes the batch)."""
        return SequenceState({i: LayerState(s.conv[index], None if s.recurrent is None else s.recurrent[index])
                              for i, s in self.layers.items()}, self.position)
