"""Load a Hugging Face safetensors checkpoint into CausalLM, fusing q/k/v and gate/up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.errors import ModelError
from engine.model import CausalLM


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory (sharded or not)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"The model's safetensors index cannot be read ({exc}).") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"The model directory {model_dir} has no .safetensors weights.")
    return files


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


def _fused_state(cfg: ModelConfig, ckpt: _Checkpoint) -> Iterator[tuple[str, torch.Tensor]]:
    yield "embed_tokens.weight", ckpt.get("model.embed_tokens.weight")
    yield "norm.weight", ckpt.get("model.norm.weight")
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", ckpt.get("lm_head.weight")
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        yield dst + "self_attn.qkv_proj.weight", torch.cat([ckpt.get(f"{attn}{p}_proj.weight") for p in "qkv"])
        if cfg.qkv_bias:
            yield dst + "self_attn.qkv_proj.bias", torch.cat([ckpt.get(f"{attn}{p}_proj.bias") for p in "qkv"])
        yield dst + "self_attn.o_proj.weight", ckpt.get(attn + "o_proj.weight")
        if cfg.o_bias:
            yield dst + "self_attn.o_proj.bias", ckpt.get(attn + "o_proj.bias")
        if cfg.qk_norm:
            yield dst + "self_attn.q_norm.weight", ckpt.get(attn + "q_norm.weight")
            yield dst + "self_attn.k_norm.weight", ckpt.get(attn + "k_norm.weight")
        mlp = src + "mlp."
        yield dst + "mlp.gate_up_proj.weight", torch.cat([ckpt.get(mlp + "gate_proj.weight"), ckpt.get(mlp + "up_proj.weight")])
        yield dst + "mlp.down_proj.weight", ckpt.get(mlp + "down_proj.weight")
        if cfg.mlp_bias:
            yield dst + "mlp.gate_up_proj.bias", torch.cat([ckpt.get(mlp + "gate_proj.bias"), ckpt.get(mlp + "up_proj.bias")])
            yield dst + "mlp.down_proj.bias", ckpt.get(mlp + "down_proj.bias")
        yield dst + "input_layernorm.weight", ckpt.get(src + "input_layernorm.weight")
        yield dst + "post_attention_layernorm.weight", ckpt.get(src + "post_attention_layernorm.weight")


def load_model(model_dir: Path, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Build CausalLM from config.json and fill it from the directory's safetensors."""
    cfg = ModelConfig.from_file(model_dir / "config.json")
    with torch.device("meta"):
        model = CausalLM(cfg)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        ckpt = _Checkpoint(checkpoint_files(model_dir), stack)
        for name, tensor in _fused_state(cfg, ckpt):
            if tensor.shape != expected[name].shape:
                raise ModelError(
                    f"The weights tensor for {name} has shape {tuple(tensor.shape)}, "
                    f"but config.json implies {tuple(expected[name].shape)}."
                )
            state[name] = tensor.to(device=device, dtype=dtype)
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval().requires_grad_(False)
    model.prepare()
    return model
