"""A mixture-of-experts MLP (Qwen3-MoE, gpt-oss, Gemma 4): a router and gated-MLP experts, each token using a few."""

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
    k alone; its experts have biases (model/mlp.py gates them). Gemma 4's (MoEConfig.scaled_router) scores
    its own input (forward's `router_input`) times a learned vector and 1/sqrt(hidden), and multiplies each
    renormalised weight by its expert's learned scale, in fp32, as transformers keeps them until they have
    weighted the experts' outputs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe = cfg.moe
        self.per_token, self.normalize = moe.per_token, moe.normalize
        self.softmax_after_topk = moe.softmax_after_topk
        self.gate = nn.Linear(cfg.hidden_size, moe.experts, bias=moe.biased)  # the router
        self.experts = nn.ModuleList(GatedMLP(cfg, moe.intermediate_size, moe.biased) for _ in range(moe.experts))
        self.scaled_router = moe.scaled_router
        if self.scaled_router:
            self.router_scale = nn.Parameter(torch.ones(cfg.hidden_size))
            self.expert_scales = nn.Parameter(torch.ones(moe.experts))
            self.input_scale = cfg.hidden_size ** -0.5

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, per_token] in x's dtype, fp32 with a scaled router; expert ids [T, per_token]) of each
        row of x."""
        if self.softmax_after_topk:
            logits, chosen = torch.topk(self.gate(x), self.per_token, dim=-1)
            return F.softmax(logits, dim=-1, dtype=logits.dtype), chosen
        if self.scaled_router:
            x = x * self.router_scale * self.input_scale
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.per_token, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.scaled_router:
            return weights * self.expert_scales[chosen], chosen
        return weights.to(x.dtype), chosen

    def forward(self, x: torch.Tensor, router_input: torch.Tensor | None = None) -> torch.Tensor:
        """The experts' weighted sum for each row of x, routed on x (or on `router_input`, row for row)."""
        weights, chosen = self.route(x if router_input is None else router_input)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():  # ascending
            rows, slot = torch.where(chosen == expert)
            y = self.experts[expert](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out
