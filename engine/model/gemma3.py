"""The blocks of a Gemma 3 decoder layer where they differ from Llama's (model/layers.py).

- RMSNorm weights are offsets: the norm multiplies by (1 + w), in fp32, before casting back
  (transformers' Gemma3RMSNorm; Llama casts first, then multiplies by w).
- Four norms a layer: the attention's and the MLP's outputs are normalised too, before each
  joins the residual stream ("sandwich" norms).
- q/k are normalised per head with the same offset norm; the MLP is GELU-tanh gated; the
  window and RoPE of a sliding layer come from the config (Attention reads them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.kv.cache import KVAttention
from engine.config.model import ModelConfig
from engine.model.layers import Attention
from engine.model.mlp import GatedMLP


class OffsetRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))  # the checkpoint's w; the norm scales by 1 + w
        self.eps = eps
        self.scale: torch.Tensor | None = None  # 1 + w in fp32, made by prepare() once weights are in

    def prepare(self) -> None:
        self.scale = 1.0 + self.weight.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the reference's formula below, to rounding
            return F.rms_norm(x, self.scale.shape, self.scale, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.scale).type_as(x)


class Gemma3DecoderLayer(nn.Module):
    NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm")

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, norm=OffsetRMSNorm)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, cache, mask,
                                                             q_scale))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
