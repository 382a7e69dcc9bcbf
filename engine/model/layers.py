"""The blocks of a Llama-family decoder: RMSNorm, attention, one layer (its MLP: model/mlp.py, model/moe.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.model import ModelConfig
from engine.kv.cache import KVAttention
from engine.model.mlp import GatedMLP
from engine.model.moe import SparseMoE
from engine.model.rope import apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; same values as the reference's formula below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in fp32 and scale in the input dtype, as the reference does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k RMSNorm (Qwen3, Gemma 3), RoPE, GQA, the layer's
    sliding window if it has one (Gemma 3, gpt-oss), its attention sinks (gpt-oss) and q's attention temperature
    (Ministral 3) if the model has them."""

    def __init__(self, cfg: ModelConfig, layer: int, norm: type[nn.Module] = RMSNorm):
        super().__init__()
        # Where its K/V are kept: a hybrid model's cache holds its attention layers only (HybridLayers.kv_slot).
        self.layer = layer if cfg.hybrid is None else cfg.hybrid.kv_slot(layer)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.q_scale
        self.window = cfg.window(layer)
        self.rope = cfg.uses_rope(layer)  # SmolLM3's NoPE layers attend without positions in q/k
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = norm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = norm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        # gpt-oss: a logit per query head that joins every softmax and attends to nothing
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        """q_scale: [T, 1, 1] multipliers of each new token's q (model/temperature.py), or None."""
        num_new, heads, kv_heads = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_new, heads + 2 * kv_heads, self.head_dim)
        qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :heads]), self.k_norm(qk[:, heads:])), dim=1)
        if self.rope:
            qk = apply_rotary(qk, cos, sin)  # q and k heads rotated together: one set of ops
        q, k = qk[:, :heads], qk[:, heads:]
        if q_scale is not None:  # after RoPE, as transformers' Ministral 3 scales its rotated query_states
            q = q * q_scale
        out = cache.attention(self.layer, q, k.transpose(0, 1), v.transpose(0, 1), mask, self.scale, self.window,
                              self.sinks)
        return self.o_proj(out)


class DecoderLayer(nn.Module):
    NORMS = ("input_layernorm", "post_attention_layernorm")  # checkpoint names of its norms

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg) if cfg.is_moe(layer) else GatedMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, mask, q_scale)
        return x + self.mlp(self.post_attention_layernorm(x))

