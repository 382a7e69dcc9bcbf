"""gpt-oss's Hugging Face checkpoint keeps each layer's experts stacked, as matrices to multiply from the
right, with gate and up interleaved column by column; the loader asks for one Linear-layout matrix an
expert (checkpoint.py). This view answers those names from the stacked tensors."""

from __future__ import annotations

import re

import torch

from engine.errors import ModelError

# model.layers.<i>.mlp.experts.<e>.<gate|up|down>_proj.<weight|bias>, and the router (ours: mlp.gate)
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
_ROUTER = re.compile(r"(model\.layers\.\d+\.mlp\.)gate\.(weight|bias)$")


class StackedExperts:
    """A WeightSource over a checkpoint whose experts are stacked gpt-oss's way (the other tensors as they are).

    gate_up_proj [experts, hidden, 2 * intermediate] holds gate in its even columns and up in its odd ones;
    down_proj [experts, intermediate, hidden]; their biases [experts, 2 * intermediate] and [experts, hidden].
    One layer's stacked tensors are kept while its experts are read (the loader reads layer by layer), so
    each is read from the file once."""

    def __init__(self, ckpt):
        self._ckpt = ckpt
        self._layer: tuple[str, dict[str, torch.Tensor]] = ("", {})

    def __contains__(self, name: str) -> bool:
        stored = self._stored(name)
        return (stored[0] if stored is not None else name) in self._ckpt

    def get(self, name: str) -> torch.Tensor:
        stored = self._stored(name)
        if stored is None:
            return self._ckpt.get(name)
        tensor_name, select = stored
        return select(self._stacked(tensor_name)).contiguous()

    def block_format(self, name: str) -> str | None:
        return None if _EXPERT.match(name) or _ROUTER.match(name) else self._ckpt.block_format(name)

    def _stacked(self, name: str) -> torch.Tensor:
        layer = name.rsplit(".mlp.", 1)[0]
        if self._layer[0] != layer:
            self._layer = (layer, {})
        tensors = self._layer[1]
        if name not in tensors:
            tensors[name] = self._ckpt.get(name)
        return tensors[name]

    def _stored(self, name: str):
        """(the stored tensor's name, how to take this matrix from it), or None: stored as asked."""
        if match := _ROUTER.match(name):
            return f"{match[1]}router.{match[2]}", lambda t: t
        match = _EXPERT.match(name)
        if match is None:
            return None
        layer, expert, projection, kind = int(match[1]), int(match[2]), match[3], match[4]
        prefix = f"model.layers.{layer}.mlp.experts."
        if projection == "down":
            if kind == "weight":
                return prefix + "down_proj", lambda t: _expert(t, expert, name).T
            return prefix + "down_proj_bias", lambda t: _expert(t, expert, name)
        column = 0 if projection == "gate" else 1  # interleaved: gate even, up odd
        if kind == "weight":
            return prefix + "gate_up_proj", lambda t: _expert(t, expert, name)[:, column::2].T
        return prefix + "gate_up_proj_bias", lambda t: _expert(t, expert, name)[column::2]


def _expert(stacked: torch.Tensor, expert: int, name: str) -> torch.Tensor:
    if expert >= stacked.shape[0]:
        raise ModelError(f"The model's weights have no tensor named {name!r}.")
    return stacked[expert]
