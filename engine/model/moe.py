"""A mixture-of-experts MLP (Qwen3-MoE, gpt-oss): a router and gated-MLP experts, of which each token uses a few."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.model import ModelConfig
from engine.model.mlp import GatedMLP


class SparseMoE(nn.Module):
    """A mixture of experts (Qwen3-MoE): a router scores every expert for each token, the token goes through
    the `per_token` best (gated MLPs of their own), and their outputs are summed weighted by the router's
    softmax probabilities (renormalised over the chosen ones when the config says so).

    Only the chosen experts' weights are read: each expert runs once over the rows routed to it. A row's
    sum is taken in ascending expert order whatever the other rows chose (transformers' order too), so a
    token's output does not depend on the batch it is in. Ties in the router resolve as torch.topk
    resolves them, on the same fp32 probabilities transformers computes.

    gpt-oss's router differs: it has a bias, and takes the top-k logits first, then the softmax over those
    k alone; its experts have biases (model/mlp.py gates them)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe = cfg.moe
        self.per_token, self.normalize = moe.per_token, moe.normalize
        self.softmax_after_topk = moe.softmax_after_topk
        self.gate = nn.Linear(cfg.hidden_size, moe.experts, bias=moe.biased)  # the router
        self.experts = nn.ModuleList(GatedMLP(cfg, moe.intermediate_size, moe.biased) for _ in range(moe.experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, per_token] in x's dtype, expert ids [T, per_token]) of each row of x."""
        if self.softmax_after_topk:
            logits, chosen = torch.topk(self.gate(x), self.per_token, dim=-1)
            return F.softmax(logits, dim=-1, dtype=logits.dtype), chosen
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.per_token, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.route(x)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():  # ascending
            rows, slot = torch.where(chosen == expert)
            y = self.experts[expert](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
        return out
