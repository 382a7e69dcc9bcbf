"""The blocks of a Gemma 4 decoder layer (text), where they differ from Gemma 3's (model/gemma3.py).

- RMSNorm weights multiply as they are (not 1 + w), in fp32; values are normalised too, by a norm with no
  weight. q.k is not scaled: the q/k norms take the scale's place.
- A full-attention layer may have its own head size and KV heads, and with attention_k_eq_v no v_proj: its
  values are its keys' projection, before the k norm and RoPE.
- The last layers may compute no K/V (num_kv_shared_layers): each attends over those of the last earlier
  layer of its kind (ModelConfig.gemma4.kv_sources).
- Each layer may add a per-layer input (PerLayerInputs): a gated projection of it joins the residual stream
  after the MLP; the layer's output is then multiplied by its learned layer_scalar.
- With enable_moe_block (the 26B-A4B), every layer runs routed experts (model/moe.py) beside its MLP, on the
  same residual stream under norms of their own; the router reads that stream through a norm with no weight.
  The MLP's and the experts' outputs, each normalised, are summed before the MLP's usual post-norm.

The KV cache has one shape for every layer (kv/cache.py, kv/pool.py and the paths that copy it), so a layer
stores its K/V in the largest layer's shape (ModelConfig.head_dim, num_kv_heads): its heads repeated where it
has fewer (query head h still reads its own KV head h // group) and its dims zero-padded, q too, which adds
exact zeros to every q.k and only zero columns to the output, cut off before o_proj. That costs memory: on
the released models the sliding layers' KV take twice their size (head 256 stored as 512). A shared layer stores,
under its own index, the very K/V its source layer computed for the same tokens, so every cache path
(contiguous, paged, prefix cache, disk) holds it like any layer's, at the cost of those layers' K/V memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from engine.kv.cache import KVAttention
from engine.config.model import ModelConfig
from engine.model.mlp import ACTIVATIONS, GatedMLP
from engine.model.moe import SparseMoE
from engine.model.rope import apply_rotary


class Gemma4RMSNorm(nn.Module):
    """transformers' Gemma4RMSNorm: normalise in fp32, multiply by w (none: `scaled` False), cast back."""

    def __init__(self, dim: int, eps: float, scaled: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if scaled else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the reference's formula below, to rounding
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        return (h if self.weight is None else h * self.weight.float()).type_as(x)


@dataclass
class LayerInputs:
    """What a forward pass hands every layer beside the residual stream: the per-layer inputs
    [T, layers, size] (None: the model has none), and the new tokens' K/V of each layer others reuse."""

    per_layer: torch.Tensor | None
    shared: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        layout = cfg.gemma4
        self.layer, self.window = layer, cfg.window(layer)
        self.num_heads, self.head_dim, self.kv_heads = cfg.num_heads, layout.head_dims[layer], layout.kv_heads[layer]
        self.cache_heads, self.cache_dim = cfg.num_kv_heads, cfg.head_dim
        self.source = layout.kv_sources[layer]  # None: this layer computes its own K/V
        self.keeps_kv = layer in layout.kv_sources  # a later layer reuses this one's
        self.k_eq_v = layout.k_eq_v[layer]
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * self.head_dim, bias=False)
        self.q_norm = Gemma4RMSNorm(self.head_dim, cfg.rms_norm_eps)
        if self.source is None:  # k (and v, unless k_eq_v) fused into one matmul
            kv_rows = self.kv_heads * self.head_dim * (1 if self.k_eq_v else 2)
            self.kv_proj = nn.Linear(cfg.hidden_size, kv_rows, bias=False)
            self.k_norm = Gemma4RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.v_norm = Gemma4RMSNorm(self.head_dim, cfg.rms_norm_eps, scaled=False)
        self.o_proj = nn.Linear(cfg.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, inputs: LayerInputs) -> torch.Tensor:
        num_new = x.shape[0]
        q = apply_rotary(self.q_norm(self.q_proj(x).view(num_new, self.num_heads, self.head_dim)), cos, sin)
        if self.source is None:
            kv = self.kv_proj(x).view(num_new, -1, self.head_dim)
            k = kv[:, : self.kv_heads]
            v = k if self.k_eq_v else kv[:, self.kv_heads :]  # the raw keys, before their norm and RoPE
            k = self._cache_shaped(apply_rotary(self.k_norm(k), cos, sin))
            v = self._cache_shaped(self.v_norm(v))
            if self.keeps_kv:
                inputs.shared[self.layer] = (k, v)
        else:
            k, v = inputs.shared[self.source]
        q = F.pad(q, (0, self.cache_dim - self.head_dim))
        out = cache.attention(self.layer, q, k, v, mask, 1.0, self.window)
        out = out.view(num_new, self.num_heads, self.cache_dim)[..., : self.head_dim]
        return self.o_proj(out.reshape(num_new, self.num_heads * self.head_dim))

    def _cache_shaped(self, t: torch.Tensor) -> torch.Tensor:
        """[T, kv_heads, head_dim] -> [cache_heads, T, cache_dim] (see the module's docstring)."""
        if self.kv_heads < self.cache_heads:
            t = t.repeat_interleave(self.cache_heads // self.kv_heads, dim=1)
        return F.pad(t, (0, self.cache_dim - self.head_dim)).transpose(0, 1)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        eps, hidden, layout = cfg.rms_norm_eps, cfg.hidden_size, cfg.gemma4
        self.layer = layer
        self.input_layernorm = Gemma4RMSNorm(hidden, eps)
        self.self_attn = Gemma4Attention(cfg, layer)
        self.post_attention_layernorm = Gemma4RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = Gemma4RMSNorm(hidden, eps)
        self.mlp = GatedMLP(cfg, intermediate_size=layout.intermediate[layer])
        self.per_layer_input = layout.per_layer_input
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm", "self_attn.q_norm"]
        if self.self_attn.source is None:
            norms.append("self_attn.k_norm")
        self.moe = SparseMoE(cfg) if cfg.is_moe(layer) else None
        if self.moe is not None:
            self.router_norm = Gemma4RMSNorm(hidden, eps, scaled=False)
            self.post_feedforward_layernorm_1 = Gemma4RMSNorm(hidden, eps)  # the MLP's output
            self.pre_feedforward_layernorm_2 = Gemma4RMSNorm(hidden, eps)  # the experts' input
            self.post_feedforward_layernorm_2 = Gemma4RMSNorm(hidden, eps)  # the experts' output
            norms += ["post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2"]
        if self.per_layer_input:
            self.act = ACTIVATIONS[cfg.hidden_act]
            self.per_layer_input_gate = nn.Linear(hidden, self.per_layer_input, bias=False)
            self.per_layer_projection = nn.Linear(self.per_layer_input, hidden, bias=False)
            self.post_per_layer_input_norm = Gemma4RMSNorm(hidden, eps)
            norms.append("post_per_layer_input_norm")
        self.NORMS = tuple(norms)  # checkpoint names of its norms (they vary by layer)
        self.layer_scalar = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None,
                inputs: LayerInputs | None = None) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, cache, mask, inputs))
        x = x + self.post_feedforward_layernorm(self._feed_forward(x))
        if self.per_layer_input:
            gated = self.act(self.per_layer_input_gate(x)) * inputs.per_layer[:, self.layer]
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return x * self.layer_scalar

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP's output, or beside the experts the sum of both, each under its own post-norm."""
        out = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe is None:
            return out
        experts = self.moe(self.pre_feedforward_layernorm_2(x), router_input=self.router_norm(x))
        return self.post_feedforward_layernorm_1(out) + self.post_feedforward_layernorm_2(experts)


class PerLayerInputs(nn.Module):
    """Gemma 4's per-layer inputs [T, layers, size]: each token's own slice of a second embedding (scaled
    by sqrt(size)), plus a normalised projection of its scaled main embedding, the sum times 1/sqrt(2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers, self.size = cfg.num_layers, cfg.gemma4.per_layer_input
        self.embed_tokens_per_layer = nn.Embedding(cfg.gemma4.per_layer_vocab, self.layers * self.size)
        self.per_layer_model_projection = nn.Linear(cfg.hidden_size, self.layers * self.size, bias=False)
        self.per_layer_projection_norm = Gemma4RMSNorm(self.size, cfg.rms_norm_eps)
        self.projection_scale = cfg.hidden_size ** -0.5
        self.token_scale: torch.Tensor | None = None  # sqrt(size) in the weights' dtype, made by prepare()

    def prepare(self) -> None:
        weight = self.per_layer_projection_norm.weight  # the projection may be a QuantLinear (no .weight)
        self.token_scale = torch.tensor(self.size ** 0.5, dtype=torch.float32).to(weight)

    def forward(self, token_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        shape = (token_ids.shape[0], self.layers, self.size)
        tokens = (self.embed_tokens_per_layer(token_ids) * self.token_scale).view(shape)
        projected = (self.per_layer_model_projection(embedded) * self.projection_scale).view(shape)
        return (self.per_layer_projection_norm(projected) + tokens) * 2.0 ** -0.5


def checkpoint_linears(cfg: ModelConfig) -> list[tuple[str, list[str], None]]:
    """(module path, checkpoint weight names, no bias) of a Gemma 4 model's linear layers but lm_head."""
    specs = []
    for i in range(cfg.num_layers):
        ours, stored = f"layers.{i}.", f"model.layers.{i}."
        attn = stored + "self_attn."
        specs += [(ours + "self_attn.q_proj", [attn + "q_proj"], None),
                  (ours + "self_attn.o_proj", [attn + "o_proj"], None),
                  (ours + "mlp.gate_up_proj", [stored + "mlp.gate_proj", stored + "mlp.up_proj"], None),
                  (ours + "mlp.down_proj", [stored + "mlp.down_proj"], None)]
        if cfg.gemma4.kv_sources[i] is None:
            kv = [attn + "k_proj"] if cfg.gemma4.k_eq_v[i] else [attn + "k_proj", attn + "v_proj"]
            specs.append((ours + "self_attn.kv_proj", kv, None))
        if cfg.gemma4.per_layer_input:
            specs += [(ours + name, [stored + name], None) for name in ("per_layer_input_gate", "per_layer_projection")]
        if cfg.is_moe(i):  # the router, then each expert's gated MLP (stored stacked: weights/stacked_experts.py)
            specs.append((ours + "moe.gate", [stored + "router.proj"], None))
            for e in range(cfg.moe.experts):
                expert = f"{stored}experts.{e}."
                specs += [(f"{ours}moe.experts.{e}.gate_up_proj", [expert + "gate_proj", expert + "up_proj"], None),
                          (f"{ours}moe.experts.{e}.down_proj", [expert + "down_proj"], None)]
    if cfg.gemma4.per_layer_input:
        specs.append(("per_layer_inputs.per_layer_model_projection", ["model.per_layer_model_projection"], None))
    return specs


def checkpoint_tensors(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our name, checkpoint name) of a Gemma 4 model's other tensors beyond the layers' norms."""
    names = [(f"layers.{i}.layer_scalar", f"model.layers.{i}.layer_scalar") for i in range(cfg.num_layers)]
    names += [(f"layers.{i}.moe.{ours}", f"model.layers.{i}.router.{stored}") for i in range(cfg.num_layers)
              if cfg.is_moe(i) for ours, stored in (("router_scale", "scale"), ("expert_scales", "per_expert_scale"))]
    if cfg.gemma4.per_layer_input:
        names += [("per_layer_inputs.embed_tokens_per_layer.weight", "model.embed_tokens_per_layer.weight"),
                  ("per_layer_inputs.per_layer_projection_norm.weight", "model.per_layer_projection_norm.weight")]
    return names
