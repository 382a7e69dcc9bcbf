"""A mixture-of-experts MLP (Qwen3-MoE, gpt-oss, Gemma 4, Qwen3.5-MoE): a router and gated-MLP experts, each token
using a few (and, Qwen3.5-MoE's, a gated shared expert every token uses).

The chosen experts run one of two ways, with the same sums in the same order:
- per expert module (the loop form): each chosen expert once over its rows, found by reading the routes
  back to the host. The CPU's way: its experts may be quantized linears (engine/cpu), read by the fused C
  step too.
- stacked (SparseMoE.stack_experts; CausalLM.prepare does it on a CUDA device): the experts' dense weights
  as [experts, ...] tensors. A decode step's few (row, expert) pairs gather their experts' weights and
  multiply in batches, reading nothing back to the host, so a CUDA graph captures the step; a prefill's many
  pairs are sorted by expert and each expert's contiguous slice multiplied by its weights where they lie.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from engine.config.model import ModelConfig
from engine.model.mlp import GatedMLP

# The most (row, expert) pairs the gathered form takes at once: a decode step's (1 or 2 rows of Qwen3-MoE, 8
# experts a token; up to 4 of gpt-oss, 4 a token). Each pair copies its expert's weights, so more pairs cost
# more memory and traffic than reading each chosen expert once (the grouped form).
GATHER_PAIRS = 16


@dataclass(frozen=True)
class ExpertStack:
    """A layer's experts' weights stacked by expert id, in nn.Linear's layout: gate_up [E, 2I, H] (gate's rows
    first), down [E, H, I], their biases [E, 2I] and [E, H] (gpt-oss) or None. These own the memory: each
    expert's Linear holds views of its slice (nothing is doubled, and the loop form still runs)."""

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    ids: torch.Tensor  # [E] long: 0..E-1, where the grouped form finds each expert's slice
    # torch._grouped_mm multiplies every slice in one kernel with its offsets on the device: bf16 on a CUDA
    # device of compute capability 9.x or 10.x, rows of 16 bytes. Elsewhere it loops, reading offsets back.
    grouped_mm: bool


class SparseMoE(nn.Module):
    """A mixture of experts (Qwen3-MoE): a router scores every expert for each token, the token goes through
    the `per_token` best (gated MLPs of their own), and their outputs are summed weighted by the router's
    softmax probabilities (renormalised over the chosen ones when the config says so).

    Only the chosen experts' weights are read (the gathered form reads them as copies). A row's sum is taken
    in ascending expert order whatever the other rows chose (transformers' order too), so a token's output
    does not depend on the batch it is in. Ties in the router resolve as torch.topk resolves them, on the
    same fp32 probabilities transformers computes, whichever form runs.

    gpt-oss's router differs: it has a bias, and takes the top-k logits first, then the softmax over those
    k alone; its experts have biases (model/mlp.py gates them). Gemma 4's (MoEConfig.scaled_router) scores
    its own input (forward's `router_input`) times a learned vector and 1/sqrt(hidden), and multiplies each
    renormalised weight by its expert's learned scale, in fp32, as transformers keeps them until they have
    weighted the experts' outputs. Qwen3.5-MoE's (MoEConfig.shared_intermediate_size) adds to the routed sum a
    shared expert's output times sigmoid(shared_expert_gate(x)), in x's dtype, as transformers adds it."""

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
        self.shared_expert, self.shared_expert_gate = None, None
        if moe.shared_intermediate_size:
            self.shared_expert = GatedMLP(cfg, moe.shared_intermediate_size, moe.biased)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.stack: ExpertStack | None = None  # a plain attribute: the experts' parameters already count it

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

    def stack_experts(self) -> bool:
        """Stack the experts' weights (ExpertStack) if every expert is plain dense nn.Linear layers; quantized
        experts (the CPU's formats) stay in the loop form. Returns whether the layer is stacked."""
        gate_up = [expert.gate_up_proj for expert in self.experts]
        down = [expert.down_proj for expert in self.experts]
        if self.stack is None and all(type(linear) is nn.Linear for linear in gate_up + down):
            weights = [_stacked(gate_up, "weight"), _stacked(down, "weight")]  # one at a time: less memory at peak
            grouped = (hasattr(torch, "_grouped_mm") and weights[0].is_cuda and weights[0].dtype == torch.bfloat16
                       and torch.cuda.get_device_capability(weights[0].device)[0] in (9, 10)
                       and all(n % 8 == 0 for n in weights[1].shape[1:]))
            self.stack = ExpertStack(*weights, _stacked(gate_up, "bias"), _stacked(down, "bias"),
                                     torch.arange(len(self.experts), device=weights[0].device), grouped)
        return self.stack is not None

    def forward(self, x: torch.Tensor, router_input: torch.Tensor | None = None) -> torch.Tensor:
        """The experts' weighted sum for each row of x, routed on x (or on `router_input`, row for row), plus the
        gated shared expert's output where there is one."""
        out = self._routed(x, router_input)
        if self.shared_expert is None:
            return out
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def _routed(self, x: torch.Tensor, router_input: torch.Tensor | None) -> torch.Tensor:
        weights, chosen = self.route(x if router_input is None else router_input)
        if self.stack is None:
            return self._per_expert(x, weights, chosen)
        chosen, order = chosen.sort(dim=-1)  # each row's experts ascending: its sum in the loop form's order
        weights = weights.gather(-1, order)
        grouped_mm = self.stack.grouped_mm and not torch.compiler.is_compiling()
        # Many pairs are grouped, unless the grouping would read its slices' bounds back to the host while a graph
        # is captured or traced (a batch of decode rows there): then gathered, GATHER_PAIRS pairs at a time.
        if chosen.numel() <= GATHER_PAIRS or (not grouped_mm and _host_sync_forbidden(x)):
            pairs = self.gathered(x, chosen)
        else:
            pairs = self.grouped(x, chosen, grouped_mm)
        pairs = (pairs * weights.unsqueeze(-1)).to(x.dtype)  # Gemma 4's fp32 weights: cast as the loop form does
        out = pairs[:, 0]
        for slot in range(1, self.per_token):  # one rounding an add, as the loop form's index_add_
            out = out + pairs[:, slot]
        return out

    def _per_expert(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():  # ascending
            rows, slot = torch.where(chosen == expert)
            y = self.experts[expert](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out

    def gathered(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """[T, k, H]: each (row, slot)'s expert output, its expert's weights gathered and multiplied pair by
        pair in one batch (bmm), GATHER_PAIRS pairs at a time. Shapes follow x's and nothing is read back to
        the host, so a CUDA graph captures it; each pair is multiplied alone, whatever the other rows."""
        rows, k = chosen.shape
        ids, s = chosen.reshape(-1), self.stack
        xs = x.unsqueeze(1).expand(rows, k, x.shape[-1]).reshape(-1, x.shape[-1])
        out = x.new_empty(rows * k, x.shape[-1])
        for first in range(0, rows * k, GATHER_PAIRS):
            part, a = ids[first : first + GATHER_PAIRS], xs[first : first + GATHER_PAIRS]
            h = _biased(torch.bmm(s.gate_up[part], a.unsqueeze(-1)).squeeze(-1), s.gate_up_bias, part)
            h = self._activate(h)
            out[first : first + GATHER_PAIRS] = _biased(torch.bmm(s.down[part], h.unsqueeze(-1)).squeeze(-1),
                                                        s.down_bias, part)
        return out.view(rows, k, -1)

    def grouped(self, x: torch.Tensor, chosen: torch.Tensor, grouped_mm: bool) -> torch.Tensor:
        """[T, k, H] as `gathered`, the pairs sorted by expert so that each expert multiplies its contiguous
        slice of rows by its weights where they lie: all slices in one torch._grouped_mm (`grouped_mm`, its
        offsets found on the device), else one matmul an expert, the slices' bounds read back to the host."""
        rows, k = chosen.shape
        ids, s = chosen.reshape(-1), self.stack
        order = ids.argsort(stable=True)  # by expert, rows ascending within one: the loop form's x[rows]
        by_expert, xs = ids[order], x[order // k]
        if grouped_mm:
            ends = torch.searchsorted(by_expert, s.ids, right=True).to(torch.int32)

            def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                return _biased(torch._grouped_mm(a, w.transpose(1, 2), offs=ends), bias, by_expert)
        else:
            counts = torch.bincount(ids, minlength=len(self.experts)).tolist()
            bounds = [(e, end - n, end) for e, (n, end) in enumerate(zip(counts, accumulate(counts))) if n]

            def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
                return torch.cat([F.linear(a[lo:hi], w[e], None if bias is None else bias[e]) for e, lo, hi in bounds])
        h = self._activate(matmul(xs, s.gate_up, s.gate_up_bias))
        y = matmul(h, s.down, s.down_bias)
        return torch.empty_like(y).index_copy_(0, order, y).view(rows, k, -1)

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.experts[0].activate(*gate_up.split(self.experts[0].intermediate, dim=-1))


def routes_on_host(model: nn.Module) -> bool:
    """Whether a mixture layer of `model` runs the loop form, whose routes are read back to the host every
    layer: a step no CUDA graph can capture."""
    return any(isinstance(m, SparseMoE) and m.stack is None for m in model.modules())


def _stacked(linears: list[nn.Linear], name: str) -> torch.Tensor | None:
    """The `name` tensors ("weight", "bias") of `linears` stacked, each Linear's own replaced by a view of its
    slice (the old one freed unless something else holds it)."""
    if getattr(linears[0], name) is None:
        return None
    stacked = torch.stack([getattr(linear, name) for linear in linears])
    for linear, view in zip(linears, stacked):
        setattr(linear, name, nn.Parameter(view, requires_grad=False))
    return stacked


def _biased(y: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    return y if bias is None else y + bias[ids]


def _host_sync_forbidden(x: torch.Tensor) -> bool:
    """Whether a value read back to the host would break the step: torch.compile traces it, or a CUDA graph
    captures it."""
    return torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())
