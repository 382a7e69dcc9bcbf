"""HybridLayers: which token mixer each layer of a hybrid model has (Qwen3.5, LFM2), and the shapes of the
recurrent layers' state.

A hybrid model mixes attention layers with recurrent ones (Gated DeltaNet, short convolutions). Only the
attention layers keep K/V; they are numbered among themselves (`kv_slot`), so the K/V cache holds
`kv_layers` layers, not one per layer. A recurrent layer's product is a state of fixed size per sequence
(engine/recurrent/state.py): the last `conv_kernel - 1` inputs of its causal convolution, and for a Gated
DeltaNet layer a [value heads, key dim, value dim] matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION, GATED_DELTANET, SHORT_CONV = "attention", "gated_deltanet", "short_conv"


@dataclass(frozen=True)
class HybridLayers:
    mixers: tuple[str, ...]  # per layer: ATTENTION, GATED_DELTANET or SHORT_CONV
    conv_kernel: int  # taps of the recurrent layers' causal convolution
    conv_channels: int  # channels it convolves (LFM2: hidden size; Gated DeltaNet: 2 key dims + value dim)
    conv_bias: bool = False  # LFM2's conv_bias: its convolution and its short-conv layers' projections are biased
    # Gated DeltaNet only (0 for a model without it): heads and head sizes of its keys and values.
    key_heads: int = 0
    value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0

    def __post_init__(self):
        if not set(self.mixers) <= {ATTENTION, GATED_DELTANET, SHORT_CONV}:
            raise ValueError(f"unknown token mixers {sorted(set(self.mixers))}")

    def is_attention(self, layer: int) -> bool:
        return self.mixers[layer] == ATTENTION

    @property
    def kv_layers(self) -> int:
        """Layers that keep K/V (the attention layers)."""
        return sum(kind == ATTENTION for kind in self.mixers)

    def kv_slot(self, layer: int) -> int:
        """Where attention layer `layer` keeps its K/V among the attention layers."""
        if not self.is_attention(layer):
            raise ValueError(f"layer {layer} is a {self.mixers[layer]} layer: it keeps no K/V")
        return sum(kind == ATTENTION for kind in self.mixers[:layer])

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.mixers) if kind != ATTENTION)

    def conv_shape(self) -> tuple[int, int]:
        """One sequence's convolution state in a recurrent layer: the last kernel - 1 inputs per channel."""
        return (self.conv_channels, self.conv_kernel - 1)

    def recurrent_shape(self, layer: int) -> tuple[int, int, int] | None:
        """One sequence's Gated DeltaNet state in `layer` (fp32), or None for a short-convolution layer."""
        if self.mixers[layer] != GATED_DELTANET:
            return None
        return (self.value_heads, self.key_head_dim, self.value_head_dim)
