"""Qwen3.5's decoder layer (transformers' Qwen3_5DecoderLayer): a token mixer, Gated DeltaNet linear attention
(recurrent/gated_deltanet.py) or gated full attention, then a SwiGLU MLP (Qwen3.5-MoE's: a mixture of experts
with a shared expert, model/moe.py), each after a (1 + w) RMSNorm.

The gated attention's q_proj holds, per head, the head's query rows then as many rows of an output gate; the
attention's output is multiplied by sigmoid(gate) before o_proj. q and k are normalised per head by (1 + w)
norms, then rotated on their first rotary dims (partial rotary, config/qwen35.py). Only these layers keep K/V,
in the cache's slot for their layer among the attention layers (HybridLayers.kv_slot); a linear layer reads
and updates its recurrent state (KVCache.layer_state).

The loader reads the checkpoint through Qwen35Rows: q_proj's query rows as "q_proj" and its gate rows as
"self_attn.gate_proj", so that q, k, v and the gate are one matmul and a partial rotary reorder
(model/partial_rotary.py) sees q_proj as it sees any other; a GGUF's attn_q is the same interleaved tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.kv.cache import KVAttention
from engine.model.gemma3 import OffsetRMSNorm
from engine.model.mlp import GatedMLP
from engine.model.moe import SparseMoE
from engine.model.rope import apply_rotary
from engine.recurrent.gated_deltanet import GatedDeltaNet


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.slot = cfg.hybrid.kv_slot(layer)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self._split = (q_size, kv_size, kv_size, q_size)  # q, k, v, gate
        self.scale = cfg.q_scale
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self._split), bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.q_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None) -> torch.Tensor:
        num_new = x.shape[0]
        q, k, v, gate = self.qkv_proj(x).split(self._split, dim=-1)
        q = self.q_norm(q.view(num_new, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(num_new, self.num_kv_heads, self.head_dim))
        qk = apply_rotary(torch.cat((q, k), dim=1), cos, sin)  # q and k heads rotated together: one set of ops
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = v.view(num_new, self.num_kv_heads, self.head_dim)
        out = cache.attention(self.slot, q, k.transpose(0, 1), v.transpose(0, 1), mask, self.scale)
        return self.o_proj(out * torch.sigmoid(gate))


class Qwen35DecoderLayer(nn.Module):
    NORMS = ("input_layernorm", "post_attention_layernorm")  # checkpoint names of its norms

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        attention = cfg.hybrid.is_attention(layer)
        self.self_attn = GatedAttention(cfg, layer) if attention else None
        self.linear_attn = None if attention else GatedDeltaNet(cfg.hidden_size, cfg.hybrid, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg) if cfg.is_moe(layer) else GatedMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.self_attn is not None:
            h = self.self_attn(h, cos, sin, cache, mask)
        else:
            h = self.linear_attn(h, cache.layer_state(self.layer))
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


def checkpoint_linears(cfg: ModelConfig) -> list[tuple[str, list[str], None]]:
    """(module path, checkpoint weight names) of every layer's token-mixer linears (the MLPs' are the
    Llama family's): fused q, k, v, gate and o_proj of an attention layer; fused qkv, z, b, a and out_proj of
    a linear one."""
    specs = []
    for i in range(cfg.num_layers):
        if cfg.hybrid.is_attention(i):
            ours, stored, fused, out = f"layers.{i}.self_attn.", f"model.layers.{i}.self_attn.", "qkv_proj", "o_proj"
            parts = ("q_proj", "k_proj", "v_proj", "gate_proj")
        else:
            ours, stored, fused, out = f"layers.{i}.linear_attn.", f"model.layers.{i}.linear_attn.", "in_proj", "out_proj"
            parts = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        specs += [(ours + fused, [stored + p for p in parts], None), (ours + out, [stored + out], None)]
    return specs


def checkpoint_tensors(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our name, checkpoint name) of the token mixers' other tensors."""
    pairs = []
    for i in range(cfg.num_layers):
        if cfg.hybrid.is_attention(i):
            pairs += [(f"layers.{i}.self_attn.{n}.weight", f"model.layers.{i}.self_attn.{n}.weight")
                      for n in ("q_norm", "k_norm")]
        else:
            ours, stored = f"layers.{i}.linear_attn.", f"model.layers.{i}.linear_attn."
            pairs += [(ours + "conv_weight", stored + "conv1d.weight"), (ours + "dt_bias", stored + "dt_bias"),
                      (ours + "A_log", stored + "A_log"), (ours + "norm.weight", stored + "norm.weight")]
    return pairs


class Qwen35Rows:
    """A WeightSource (weights/checkpoint.py) with Qwen3.5's q_proj apart: "...self_attn.q_proj.<rest>" its
    query rows, "...self_attn.gate_proj.<rest>" its gate rows (weights, or a matrix's blocks
    "<name>.<format>.qs": whole rows either way; copies); the convolution weights [C, 1, K] as [C, K]. Any other
    tensor comes from the source as it is."""

    _HALVES = {"q_proj": 0, "gate_proj": 1}

    def __init__(self, source, cfg: ModelConfig):
        self._source = source
        self.IN_PLACE = getattr(source, "IN_PLACE", False)
        self._heads, self._head_dim = cfg.num_heads, cfg.head_dim

    def __contains__(self, name: str) -> bool:
        return self._stored(name)[0] in self._source

    def get(self, name: str) -> torch.Tensor:
        stored, half = self._stored(name)
        tensor = self._source.get(stored)
        if half is not None:  # per head: head_dim query rows, then head_dim gate rows
            rest = tensor.shape[1:]
            return tensor.reshape(self._heads, 2, self._head_dim, *rest)[:, half].reshape(-1, *rest)
        if name.endswith("linear_attn.conv1d.weight") and tensor.dim() == 3:
            return tensor.squeeze(1)
        return tensor

    def block_format(self, name: str) -> str | None:
        return self._source.block_format(self._stored(name)[0])

    def release(self, blocks: torch.Tensor) -> None:
        release = getattr(self._source, "release", None)
        if release is not None:  # a split copy is not the file's: the source leaves it alone
            release(blocks)

    def _stored(self, name: str) -> tuple[str, int | None]:
        """The source's name for `name`, and which half of q_proj's rows it is (None: the whole tensor)."""
        parts = name.split(".")
        if "self_attn" not in parts:
            return name, None
        at = parts.index("self_attn") + 1
        half = self._HALVES.get(parts[at]) if at < len(parts) else None
        if half is None:
            return name, None
        return ".".join([*parts[:at], "q_proj", *parts[at + 1:]]), half
