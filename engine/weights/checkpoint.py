"""Load a model's weights into CausalLM, from a Hugging Face safetensors checkpoint or a synthetic source.

Tensors are read through a small name -> tensor interface (WeightSource): the
safetensors files are one source, a synthetic model's seeded generator
(synthetic_weights.py) another, and all fusing and validation below is shared.
q/k/v and gate/up are fused into one matmul each. With block kernels, every
linear layer whose parts are all stored as Q4_1 or Q8_0 blocks in
blocks.safetensors becomes a QuantLinear, and its dense copy is never read.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from engine.quant.kernels import QuantKernels
from engine.quant.linear import FORMATS, QuantLinear
from engine.model.config import ModelConfig
from engine.errors import ModelError
from engine.weights.gguf import QUANT_WEIGHTS_FILE
from engine.model.causal_lm import CausalLM
from engine.weights.synthetic import read_marker, synthetic_weights


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The dense safetensors files of a model directory (sharded or not)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"The model's safetensors index cannot be read ({exc}).") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(p for p in model_dir.glob("*.safetensors") if p.name != QUANT_WEIGHTS_FILE)
    if not files:
        raise ModelError(f"The model directory {model_dir} has no .safetensors weights.")
    return files


class WeightSource(Protocol):
    """Tensors by Hugging Face checkpoint name (e.g. "model.layers.0.self_attn.q_proj.weight")."""

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> torch.Tensor:
        """The tensor (any device and dtype: the loader moves it); ModelError if there is none."""

    def block_format(self, name: str) -> str | None:
        """"q4_1" or "q8_0" if `name` is stored as quantized blocks, else None."""


class _Checkpoint:
    """Name -> tensor over one or more open safetensors files."""

    def __init__(self, files: list[Path], stack: ExitStack):
        self._where: dict[str, object] = {}
        for path in files:
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as exc:  # safetensors raises its own error types
                raise ModelError(f"The weights file {path.name} is corrupt or unreadable ({exc}).") from None
            for name in handle.keys():
                self._where[name] = handle

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise ModelError(f"The model's weights have no tensor named {name!r}.")
        try:
            return handle.get_tensor(name)
        except Exception as exc:
            raise ModelError(f"The weights tensor {name!r} cannot be read ({exc}).") from None

    def block_format(self, name: str) -> str | None:
        return next((fmt for fmt in FORMATS if f"{name}.{fmt}.qs" in self._where), None)


def _linears(cfg: ModelConfig) -> list[tuple[str, list[str], list[str] | None]]:
    """(module path, checkpoint weight names, bias names or None) of every linear layer."""
    specs = []
    for i in range(cfg.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        qkv = [f"{attn}{p}_proj" for p in "qkv"]
        gate_up = [mlp + "gate_proj", mlp + "up_proj"]
        specs += [
            (f"layers.{i}.self_attn.qkv_proj", qkv, qkv if cfg.qkv_bias else None),
            (f"layers.{i}.self_attn.o_proj", [attn + "o_proj"], [attn + "o_proj"] if cfg.o_bias else None),
            (f"layers.{i}.mlp.gate_up_proj", gate_up, gate_up if cfg.mlp_bias else None),
            (f"layers.{i}.mlp.down_proj", [mlp + "down_proj"], [mlp + "down_proj"] if cfg.mlp_bias else None),
        ]
    head = "model.embed_tokens" if cfg.tie_word_embeddings else "lm_head"
    specs.append(("lm_head", [head], None))
    return specs


def _quant_linear(kernels: QuantKernels, blocks: WeightSource, names: list[str],
                  bias: torch.Tensor | None) -> QuantLinear | None:
    formats = {blocks.block_format(f"{n}.weight") for n in names}
    if len(formats) != 1 or None in formats:
        return None  # not stored as blocks, or parts in different formats: stays dense
    fmt = formats.pop()
    parts = {part: torch.cat([blocks.get(f"{n}.weight.{fmt}.{part}") for n in names])
             for part in (("qs", "d", "m") if fmt == "q4_1" else ("qs", "d"))}
    return QuantLinear(kernels, fmt, parts["qs"], parts["d"], parts.get("m"), bias)


def _joined(ckpt: WeightSource, names: list[str], suffix: str) -> torch.Tensor:
    """The tensors of `names` stacked along dim 0 (one name: that tensor, not a copy of it)."""
    parts = [ckpt.get(name + suffix) for name in names]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def load_model(model_dir: Path, device: torch.device, dtype: torch.dtype,
               kernels: QuantKernels | None = None) -> CausalLM:
    """Build CausalLM from config.json and fill it from the directory's safetensors
    (a synthetic model's directory: from its seeded generator, on `device` in `dtype`)."""
    cfg = ModelConfig.from_file(model_dir / "config.json")
    if read_marker(model_dir) is not None:
        return load_from(cfg, synthetic_weights(model_dir, cfg, device, dtype), device, dtype)
    with ExitStack() as stack:
        ckpt = _Checkpoint(checkpoint_files(model_dir), stack)
        blocks = None
        if kernels is not None and (model_dir / QUANT_WEIGHTS_FILE).exists():
            blocks = _Checkpoint([model_dir / QUANT_WEIGHTS_FILE], stack)
        return load_from(cfg, ckpt, device, dtype, kernels, blocks)


def load_from(cfg: ModelConfig, ckpt: WeightSource, device: torch.device, dtype: torch.dtype,
              kernels: QuantKernels | None = None, blocks: WeightSource | None = None) -> CausalLM:
    """Build CausalLM for `cfg` and fill it from `ckpt` (and quantized linears from `blocks`, with `kernels`)."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}

    def put(name: str, tensor: torch.Tensor) -> None:
        if tensor.shape != expected[name].shape:
            raise ModelError(f"The weights tensor for {name} has shape {tuple(tensor.shape)}, "
                             f"but config.json implies {tuple(expected[name].shape)}.")
        state[name] = tensor.to(device=device, dtype=dtype)

    put("embed_tokens.weight", ckpt.get("model.embed_tokens.weight"))
    put("norm.weight", ckpt.get("model.norm.weight"))
    for i in range(cfg.num_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            put(f"layers.{i}.{norm}.weight", ckpt.get(f"model.layers.{i}.{norm}.weight"))
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                put(f"layers.{i}.self_attn.{norm}.weight", ckpt.get(f"model.layers.{i}.self_attn.{norm}.weight"))
    for module, names, bias_names in _linears(cfg):
        bias = _joined(ckpt, bias_names, ".bias") if bias_names else None
        packed = _quant_linear(kernels, blocks, names, bias) if blocks is not None and kernels is not None else None
        if packed is not None:
            model.set_submodule(module, packed)
            continue
        if module == "lm_head" and cfg.tie_word_embeddings:
            continue  # tied below to the dense embedding
        put(f"{module}.weight", _joined(ckpt, names, ".weight"))
        if bias is not None:
            put(f"{module}.bias", bias)
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings and not isinstance(model.lm_head, QuantLinear):
        model.lm_head.weight = model.embed_tokens.weight
    left_empty = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left_empty:
        raise ModelError(f"The model's weights do not fill {left_empty[0]}.")
    model.eval().requires_grad_(False)
    model.prepare()
    return model
