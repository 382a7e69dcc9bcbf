"""gpt-oss's and Gemma 4's Hugging Face checkpoints keep each layer's experts stacked, one tensor for all the
experts' gate and up projections and one for their down projections; the loader asks for one Linear-layout
matrix an expert (checkpoint.py). This view answers those names from the stacked tensors."""

from __future__ import annotations

import re

import torch

from engine.errors import ModelError

# model.layers.<i>.mlp.experts.<e>.<gate|up|down>_proj.<weight|bias> (Gemma 4: without "mlp."), and gpt-oss's
# router (ours: mlp.gate)
_EXPERT = re.compile(r"(model\.layers\.\d+\.(?:mlp\.)?experts\.)(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
_ROUTER = re.compile(r"(model\.layers\.\d+\.mlp\.)gate\.(weight|bias)$")


class StackedExperts:
    """A WeightSource over a checkpoint whose experts are stacked (the other tensors as they are).

    gpt-oss's way (layers' mlp.experts): gate_up_proj [experts, hidden, 2 * intermediate] holds gate in its even
    columns and up in its odd ones, down_proj [experts, intermediate, hidden], both to multiply from the right;
    their biases [experts, 2 * intermediate] and [experts, hidden]. Gemma 4's (`gemma4`, layers' experts):
    gate_up_proj [experts, 2 * intermediate, hidden] with gate's rows first, down_proj [experts, hidden,
    intermediate], Linear-layout already. One layer's stacked tensors are kept while its experts are read (the
    loader reads layer by layer), so each is read from the file once."""

    def __init__(self, ckpt, gemma4: bool = False):
        self._ckpt = ckpt
        self._gemma4 = gemma4
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
        return None if self._stored(name) is not None else self._ckpt.block_format(name)

    def dtype_and_shape(self, name: str) -> tuple[str, list[int]] | None:
        """The stored dtype and shape of `name` without reading it (checkpoint.py's _HalfPrecisionLinears asks).
        A Gemma 4 expert's matrix is a block of whole rows of its stack, which the CPU kernels read as it is;
        gpt-oss's are strided through theirs, so they answer None (read dense)."""
        stored = self._stored(name)
        if stored is None:
            return self._ckpt.dtype_and_shape(name)
        described = self._ckpt.dtype_and_shape(stored[0]) if self._gemma4 else None
        if described is None:
            return None
        dtype, (_, rows, columns) = described
        return dtype, [rows // 2 if name.endswith(("gate_proj.weight", "up_proj.weight")) else rows, columns]

    def _stacked(self, name: str) -> torch.Tensor:
        layer = name.rsplit(".experts.", 1)[0]
        if self._layer[0] != layer:
            self._layer = (layer, {})
        tensors = self._layer[1]
        if name not in tensors:
            tensors[name] = self._ckpt.get(name)
        return tensors[name]

    def _stored(self, name: str):
        """(the stored tensor's name, how to take this matrix from it), or None: stored as asked."""
        if not self._gemma4 and (match := _ROUTER.match(name)):
            return f"{match[1]}router.{match[2]}", lambda t: t
        match = _EXPERT.match(name)
        if match is None or (".mlp." in match[1]) == self._gemma4:  # not this layout's experts
            return None
        prefix, expert, projection, kind = match[1], int(match[2]), match[3], match[4]
        if self._gemma4:
            return _gemma4(prefix, expert, projection, kind, name)
        if projection == "down":
            if kind == "weight":
                return prefix + "down_proj", lambda t: _expert(t, expert, name).T
            return prefix + "down_proj_bias", lambda t: _expert(t, expert, name)
        column = 0 if projection == "gate" else 1  # interleaved: gate even, up odd
        if kind == "weight":
            return prefix + "gate_up_proj", lambda t: _expert(t, expert, name)[:, column::2].T
        return prefix + "gate_up_proj_bias", lambda t: _expert(t, expert, name)[column::2]


def _gemma4(prefix: str, expert: int, projection: str, kind: str, name: str):
    """Gemma 4's stored tensor and selection for one expert's matrix (its experts have no biases)."""
    if kind != "weight":
        return None
    if projection == "down":
        return prefix + "down_proj", lambda t: _expert(t, expert, name)

    def half(t: torch.Tensor) -> torch.Tensor:  # gate's rows, then up's
        matrix = _expert(t, expert, name)
        rows = matrix.shape[0] // 2
        return matrix[:rows] if projection == "gate" else matrix[rows:]

    return prefix + "gate_up_proj", half


def _expert(stacked: torch.Tensor, expert: int, name: str) -> torch.Tensor:
    if expert >= stacked.shape[0]:
        raise ModelError(f"The model's weights have no tensor named {name!r}.")
    return stacked[expert]
