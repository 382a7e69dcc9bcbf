"""The gated MLP of every family kvchat runs: down(act(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.model import ModelConfig

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class ClampedSwiGLU:
    """gpt-oss's gating: the gate clamped from above, the up projection into [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate), in transformers' order of operations."""

    def __init__(self, alpha: float, limit: float):
        self.alpha, self.limit = alpha, limit

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up fused into one matmul: SwiGLU (silu), GeGLU (Gemma's
    GELU-tanh), or gpt-oss's clamped SwiGLU (biased, `biased`)."""

    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None, biased: bool | None = None):
        super().__init__()
        bias = cfg.mlp_bias if biased is None else biased
        self.act = ACTIVATIONS.get(cfg.hidden_act)
        self.gating = ClampedSwiGLU(cfg.swiglu_alpha, cfg.swiglu_limit) if cfg.hidden_act == "swiglu_oai" else None
        self.intermediate = intermediate = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, cfg.hidden_size, bias=bias)

    def activate(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """What down_proj multiplies: the gating of gate and up (a mixture's stacked experts use it too)."""
        if self.gating is not None:
            return self.gating(gate, up)
        return self.act(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(*self.gate_up_proj(x).split(self.intermediate, dim=-1)))
