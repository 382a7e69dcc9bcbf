"""GatedDeltaNet: the token mixer of Qwen3.5's linear-attention layers (transformers' Qwen3_5GatedDeltaNet).

From the layer's input x: q, k, v (one projection, `in_proj_qkv`), an output gate z, and per value head a
learning rate beta = sigmoid(b) and a decay g = -exp(A_log) * softplus(a + dt_bias). q, k, v pass through a
short causal convolution (its state: the last kernel - 1 inputs) and SiLU, then the gated delta rule
(gated_delta_rule.py; its state: a memory per value head). Each head's output is RMS-normalised and gated by
SiLU(z) in fp32 (transformers' Qwen3_5RMSNormGated: a plain weight, not 1 + w), and projected back.

The four input projections are one matmul (`in_proj`, rows qkv, z, b, a: their checkpoint tensors fused at
load, weights/checkpoint.py); the convolution's weight is [channels, kernel] (the checkpoint's [C, 1, K]
squeezed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.hybrid import HybridLayers
from engine.recurrent.causal_conv import causal_conv
from engine.recurrent.gated_delta_rule import gated_delta_rule
from engine.recurrent.state import LayerState


class GatedRMSNorm(nn.Module):
    """RMSNorm of each head's output in fp32, scaled in the input dtype, then gated by SiLU(gate) in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size: int, layout: HybridLayers, eps: float):
        super().__init__()
        self.key_heads, self.value_heads = layout.key_heads, layout.value_heads
        self.key_head_dim, self.value_head_dim = layout.key_head_dim, layout.value_head_dim
        self.key_dim = layout.key_heads * layout.key_head_dim
        self.value_dim = layout.value_heads * layout.value_head_dim
        self.channels = layout.conv_channels  # q, k and v: what the convolution sees
        self._split = (self.channels, self.value_dim, self.value_heads, self.value_heads)  # qkv, z, b, a
        self.in_proj = nn.Linear(hidden_size, sum(self._split), bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(self.channels, layout.conv_kernel))
        self.dt_bias = nn.Parameter(torch.ones(self.value_heads))
        self.A_log = nn.Parameter(torch.zeros(self.value_heads))
        self.norm = GatedRMSNorm(self.value_head_dim, eps)
        self.out_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.decay_rate: torch.Tensor | None = None  # -exp(A_log) in fp32, made by prepare() once weights are in

    def prepare(self) -> None:
        self.decay_rate = -self.A_log.float().exp()

    def forward(self, x: torch.Tensor, state: LayerState) -> torch.Tensor:
        """x [T, hidden], the T new tokens of one sequence; or [rows, hidden], one token of each sequence of
        a batch whose state has a leading rows dim. Updates `state` in place; returns x's shape."""
        rows = state.conv.dim() == 3
        if rows:
            x = x.unsqueeze(1)  # [rows, 1, hidden]: one token a sequence
        qkv, z, b, a = self.in_proj(x).split(self._split, dim=-1)
        convs = [] if state.trail is not None else None  # a recording step (SequenceState.record)
        memories = [] if state.trail is not None else None
        qkv = F.silu(causal_conv(qkv, self.conv_weight, None, state.conv, convs, state.record_after))
        q, k, v = qkv.split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        q = q.unflatten(-1, (self.key_heads, self.key_head_dim))
        k = k.unflatten(-1, (self.key_heads, self.key_head_dim))
        v = v.unflatten(-1, (self.value_heads, self.value_head_dim))
        g = self.decay_rate * F.softplus(a.float() + self.dt_bias)
        out = gated_delta_rule(q, k, v, g, b.sigmoid(), state.recurrent, memories, state.record_after)
        if convs is not None:
            state.trail.extend(LayerState(conv, memory) for conv, memory in zip(convs, memories))
        out = self.norm(out, z.unflatten(-1, (self.value_heads, self.value_head_dim)))
        out = self.out_proj(out.flatten(-2))
        return out.squeeze(1) if rows else out
