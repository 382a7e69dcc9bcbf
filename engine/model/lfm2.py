"""The decoder layer of LFM2 / LFM2.5 (model_type "lfm2"): short-convolution layers and attention layers.

A layer is Llama's under other names: operator_norm, then the layer's token mixer added to the residual
stream, then ffn_norm and the gated SwiGLU MLP (feed_forward: w1 gate, w3 up, w2 down). Its mixer is either
- a short convolution (recurrent/short_conv.py), which keeps no K/V: it reads and moves on the convolution
  state the cache carries for it (`cache.layer_state(layer)`); or
- GQA attention whose q and k are RMS-normalised per head before RoPE (q_layernorm, k_layernorm) and whose
  output projection is out_proj; it keeps its K/V at its place among the attention layers
  (HybridLayers.kv_slot, model/layers.py), so the cache holds cfg.kv_layers layers.
The final norm is the checkpoint's model.embedding_norm, applied after the last layer (FINAL_NORM).

checkpoint_linears and checkpoint_tensors say where each of our weights is in transformers' Lfm2ForCausalLM
checkpoint; the layers' two norms share their names with it (NORMS).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.config.model import ModelConfig
from engine.kv.cache import KVAttention
from engine.model.layers import Attention, RMSNorm
from engine.model.mlp import GatedMLP
from engine.recurrent.short_conv import ShortConv

FINAL_NORM = "model.embedding_norm.weight"


class Lfm2DecoderLayer(nn.Module):
    NORMS = ("operator_norm", "ffn_norm")  # checkpoint names of its norms

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.operator_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.hybrid.is_attention(layer):
            # cfg.qk_norm stays False: the conv layers have no q/k norms for the loader to look for.
            self.self_attn, self.conv = Attention(replace(cfg, qk_norm=True), layer), None
        else:
            self.self_attn = None
            self.conv = ShortConv(cfg.hidden_size, cfg.hybrid.conv_kernel, cfg.hybrid.conv_bias)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = GatedMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVAttention,
                mask: torch.Tensor | None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.operator_norm(x)
        if self.conv is not None:
            h = self.conv(h, cache.layer_state(self.layer))
        else:
            h = self.self_attn(h, cos, sin, cache, mask, q_scale)
        x = x + h
        return x + self.feed_forward(self.ffn_norm(x))


def checkpoint_linears(cfg: ModelConfig) -> list[tuple[str, list[str], list[str] | None]]:
    """(module path, checkpoint weight names, bias names or None) of an LFM2 model's linear layers but lm_head."""
    biased = cfg.hybrid.conv_bias
    specs = []
    for i in range(cfg.num_layers):
        ours, stored = f"layers.{i}.", f"model.layers.{i}."
        if cfg.hybrid.is_attention(i):
            attn = stored + "self_attn."
            specs += [(ours + "self_attn.qkv_proj", [attn + "q_proj", attn + "k_proj", attn + "v_proj"], None),
                      (ours + "self_attn.o_proj", [attn + "out_proj"], None)]
        else:
            for name in ("in_proj", "out_proj"):
                parts = [f"{stored}conv.{name}"]
                specs.append((f"{ours}conv.{name}", parts, parts if biased else None))
        ff = stored + "feed_forward."
        specs += [(ours + "feed_forward.gate_up_proj", [ff + "w1", ff + "w3"], None),
                  (ours + "feed_forward.down_proj", [ff + "w2"], None)]
    return specs


def checkpoint_tensors(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our name, checkpoint name) of an LFM2 model's other tensors beyond its layers' NORMS and the final norm:
    the attention layers' q/k norms, the short convolutions' taps (and biases)."""
    names = []
    for i in range(cfg.num_layers):
        ours, stored = f"layers.{i}.", f"model.layers.{i}."
        if cfg.hybrid.is_attention(i):
            names += [(f"{ours}self_attn.{n}_norm.weight", f"{stored}self_attn.{n}_layernorm.weight") for n in "qk"]
            continue
        names.append((ours + "conv.weight", stored + "conv.conv.weight"))
        if cfg.hybrid.conv_bias:
            names.append((ours + "conv.bias", stored + "conv.conv.bias"))
    return names
