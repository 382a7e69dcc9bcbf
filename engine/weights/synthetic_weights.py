"""Seeded random weights for a ModelConfig, served by Hugging Face tensor name.

SyntheticWeights is a weight source like a safetensors checkpoint (see
checkpoint.py), but each tensor is drawn from a generator seeded by (seed, tensor
name), directly on the target device in the target dtype: an 8B model appears
in GPU memory in seconds and nothing is written to disk. The same seed, name,
device type and dtype always give the same tensor, so the transformers
reference can be filled with exactly the engine's weights. CPU and CUDA
generators differ, so the same seed gives other weights on another device type.

Scale: N(0, 0.02) for embeddings, linear weights and biases (the usual init),
ones for RMSNorm weights (zeros for Gemma's, which scale by 1 + w). With unit-RMS inputs every projection then has an
output RMS of about 0.02·sqrt(fan_in) ≈ 1.3 at hidden size 4096, so the residual
stream grows slowly and stays finite through 36 layers in bf16.
"""

from __future__ import annotations

import hashlib

import torch

from engine.config.model import ModelConfig
from engine.errors import ModelError

STD = 0.02


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of `cfg` holds: name -> shape."""
    if cfg.family == "qwen35":
        return _qwen35_shapes(cfg)
    if cfg.hybrid is not None:
        raise ModelError(f"Synthetic {cfg.model_type} models are not made: kvchat makes Qwen3.5's hybrid shape.")
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, hidden),
                                          "model.norm.weight": (hidden,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hidden)
    for i in range(cfg.num_layers):
        prefix = f"model.layers.{i}."
        for norm in norm_names(cfg):
            shapes[f"{prefix}{norm}.weight"] = (hidden,)
        linears = [("self_attn.q_proj", q_size, hidden, cfg.qkv_bias),
                   ("self_attn.k_proj", kv_size, hidden, cfg.qkv_bias),
                   ("self_attn.v_proj", kv_size, hidden, cfg.qkv_bias),
                   ("self_attn.o_proj", hidden, q_size, cfg.o_bias)]
        if cfg.is_moe(i):  # the router, then every expert's gated MLP (gpt-oss: both biased)
            biased = cfg.moe.biased
            linears.append(("mlp.gate", cfg.moe.experts, hidden, biased))
            linears += [(f"mlp.experts.{e}.{name}", rows, cols, cfg.mlp_bias or biased)
                        for e in range(cfg.moe.experts) for name, rows, cols in _mlp(cfg.moe.intermediate_size, hidden)]
        else:
            linears += [(f"mlp.{name}", rows, cols, cfg.mlp_bias) for name, rows, cols in _mlp(inter, hidden)]
        for name, out_features, in_features, bias in linears:
            shapes[f"{prefix}{name}.weight"] = (out_features, in_features)
            if bias:
                shapes[f"{prefix}{name}.bias"] = (out_features,)
        if cfg.qk_norm:
            shapes[prefix + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[prefix + "self_attn.k_norm.weight"] = (cfg.head_dim,)
        if cfg.attention_sinks:
            shapes[prefix + "self_attn.sinks"] = (cfg.num_heads,)
    return shapes


def _qwen35_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Qwen3.5's checkpoint (model/qwen35.py reads it): Gated DeltaNet layers and gated attention ones."""
    hidden, hybrid, dim = cfg.hidden_size, cfg.hybrid, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, hidden),
                                          "model.norm.weight": (hidden,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hidden)
    values = hybrid.value_heads * hybrid.value_head_dim
    for i in range(cfg.num_layers):
        prefix = f"model.layers.{i}."
        layer = {"input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
                 **{f"mlp.{name}.weight": (rows, cols) for name, rows, cols in _mlp(cfg.intermediate_size, hidden)}}
        if hybrid.is_attention(i):  # q_proj holds each head's query and output gate
            layer |= {"self_attn.q_proj.weight": (2 * cfg.num_heads * dim, hidden),
                      "self_attn.k_proj.weight": (cfg.num_kv_heads * dim, hidden),
                      "self_attn.v_proj.weight": (cfg.num_kv_heads * dim, hidden),
                      "self_attn.o_proj.weight": (hidden, cfg.num_heads * dim),
                      "self_attn.q_norm.weight": (dim,), "self_attn.k_norm.weight": (dim,)}
        else:
            layer |= {"linear_attn.in_proj_qkv.weight": (hybrid.conv_channels, hidden),
                      "linear_attn.in_proj_z.weight": (values, hidden),
                      "linear_attn.in_proj_b.weight": (hybrid.value_heads, hidden),
                      "linear_attn.in_proj_a.weight": (hybrid.value_heads, hidden),
                      "linear_attn.out_proj.weight": (hidden, values),
                      "linear_attn.conv1d.weight": (hybrid.conv_channels, 1, hybrid.conv_kernel),
                      "linear_attn.dt_bias": (hybrid.value_heads,), "linear_attn.A_log": (hybrid.value_heads,),
                      "linear_attn.norm.weight": (hybrid.value_head_dim,)}
        shapes |= {prefix + name: shape for name, shape in layer.items()}
    return shapes


def _mlp(inter: int, hidden: int) -> list[tuple[str, int, int]]:
    return [("gate_proj", inter, hidden), ("up_proj", inter, hidden), ("down_proj", hidden, inter)]


def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
    from engine.model.causal_lm import LAYERS  # the layer class of cfg's family names its norms

    return LAYERS[cfg.family][0].NORMS


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one tensor: independent of every other tensor's and of load order."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class SyntheticWeights:
    """Name -> tensor for a config, drawn on `device` in `dtype` when asked for (nothing is kept)."""

    def __init__(self, cfg: ModelConfig, seed: int, device: torch.device | str, dtype: torch.dtype):
        self.shapes = tensor_shapes(cfg)
        self.seed = seed
        self.device = torch.device(device)
        self.dtype = dtype
        self.unit_norm = 0.0 if cfg.family in ("gemma3", "qwen35") else 1.0  # the norm weight that scales by 1

    def __contains__(self, name: str) -> bool:
        return name in self.shapes

    def get(self, name: str) -> torch.Tensor:
        shape = self.shapes.get(name)
        if shape is None:
            raise ModelError(f"The synthetic model has no tensor named {name!r}.")
        if name.endswith("linear_attn.norm.weight"):  # Qwen3.5's gated norm scales by its plain weight
            return torch.ones(shape, device=self.device, dtype=self.dtype)
        if name.endswith("norm.weight"):
            return torch.full(shape, self.unit_norm, device=self.device, dtype=self.dtype)
        generator = torch.Generator(device=self.device).manual_seed(tensor_seed(self.seed, name))
        return torch.randn(shape, generator=generator, device=self.device, dtype=self.dtype).mul_(STD)

    def block_format(self, name: str) -> str | None:
        return None  # dense only: nothing is stored as Q4_1/Q8_0 blocks
