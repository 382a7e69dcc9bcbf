"""gpt-oss's and Gemma 4's Hugging Face checkpoints keep each layer's experts stacked, one tensor for all the
experts' gate and up projections and one for their down projections (Qwen3.5-MoE's may); the loader asks for one
Linear-layout matrix an expert (checkpoint.py). This view answers those names from the stacked tensors."""

from __future__ import annotations

import re

import torch

from engine.errors import ModelError

# model.layers.<i>.mlp.experts.<e>.<gate|up|down>_proj.<weight|bias> (Gemma 4: without "mlp."), and gpt-oss's
# router (ours: mlp.gate)
_EXPERT = re.compile(r"(model\.layers\.\d+\.(?:mlp\.)?experts\.)(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
_ROUTER = re.compile(r"(model\.layers\.\d+\.mlp\.)gate\.(weight|bias)$")
# The layouts: where the experts are (under mlp. or not), gpt-oss's interleaved columns or Linear-layout rows.
GPT_OSS, GEMMA4, QWEN35_MOE = "gpt_oss", "gemma4", "qwen3_5_moe"


class StackedExperts:
    """A WeightSource over a checkpoint whose experts are stacked (the other tensors as they are).

    gpt-oss's way (layers' mlp.experts): gate_up_proj [experts, hidden, 2 * intermediate] holds gate in its even
    columns and up in its odd ones, down_proj [experts, intermediate, hidden], both to multiply from the right;
    their biases [experts, 2 * intermediate] and [experts, hidden]. Gemma 4's (GEMMA4, layers' experts):
    gate_up_proj [experts, 2 * intermediate, hidden] with gate's rows first, down_proj [experts, hidden,
    intermediate], Linear-layout already. Qwen3.5-MoE's (QWEN35_MOE): Gemma 4's layout under mlp.experts, the
    router stored as it is asked for. One layer's stacked tensors are kept while its experts are read (the
    loader reads layer by layer), so each is read from the file once."""

    def __init__(self, ckpt, layout: str = GPT_OSS):
        self._ckpt = ckpt
        self._rows = layout != GPT_OSS  # Linear-layout rows, gate's first (else gpt-oss's interleaved columns)
        self._under_mlp = layout != GEMMA4
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
        gpt-oss's are strided through theirs, so they answer None (read dense). Qwen3.5-MoE's are Gemma 4's."""
        stored = self._stored(name)
        if stored is None:
            return self._ckpt.dtype_and_shape(name)
        described = self._ckpt.dtype_and_shape(stored[0]) if self._rows else None
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
        if not self._rows and (match := _ROUTER.match(name)):
            return f"{match[1]}router.{match[2]}", lambda t: t
        match = _EXPERT.match(name)
        if match is None or (".mlp." in match[1]) != self._under_mlp:  # not this layout's experts
            return None
        prefix, expert, projection, kind = match[1], int(match[2]), match[3], match[4]
        if self._rows:
            return _rows(prefix, expert, projection, kind, name)
        if projection == "down":
            if kind == "weight":
                return prefix + "down_proj", lambda t: _expert(t, expert, name).T
            return prefix + "down_proj_bias", lambda t: _expert(t, expert, name)
        column = 0 if projection == "gate" else 1  # interleaved: gate even, up odd
        if kind == "weight":
            return prefix + "gate_up_proj", lambda t: _expert(t, expert, name)[:, column::2].T
        return prefix + "gate_up_proj_bias", lambda t: _expert(t, expert, name)[column::2]


def _rows(prefix: str, expert: int, projection: str, kind: str, name: str):
    """Gemma 4's (Qwen3.5-MoE's) stored tensor and selection for one expert's matrix (their experts have no
    biases)."""
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
