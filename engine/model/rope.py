"""Rotary position embeddings (RoPE), with Llama 3's, YaRN's and LongRoPE's frequency scaling and Gemma 4's
proportional RoPE.

Weights are in Hugging Face's layout, so rotation uses the rotate-half
convention (first and second halves of each head form the pairs). A partial
rotary model's (Phi-4-mini's) q/k dims are reordered at load so that its
rotated pairs are such pairs too, and its other pairs get cos 1 and sin 0
(model/partial_rotary.py).
"""

from __future__ import annotations

import math

import torch

from engine.config.rope import RopeConfig
from engine.config.phi3 import attention_factor as longrope_attention_factor


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Per-pair rotation frequencies [rotary_dim // 2] (every pair of the head but a partial rotary one's), fp32."""
    dim = rope.rotary_dim(head_dim)
    if rope.type == "proportional":
        return _proportional(rope, head_dim)
    if rope.type == "yarn":
        return _yarn_scaled(rope, dim)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.type == "longrope":  # the divisors the engine runs (RopeConfig.long_context), in transformers' order
        divisors = torch.tensor(rope.long_factor if rope.long_context else rope.short_factor, dtype=torch.float32)
        return 1.0 / (divisors * rope.theta ** exponents)
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def magnitude(rope: RopeConfig) -> float:
    """What cos and sin are multiplied by: YaRN's or LongRoPE's attention factor (it sharpens long-context
    attention)."""
    if rope.type not in ("yarn", "longrope"):
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.type == "longrope":
        return longrope_attention_factor(rope.factor, rope.original_max_position_embeddings)
    return 1.0 if rope.factor <= 1 else 0.1 * math.log(rope.factor) + 1.0


def _proportional(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    # Gemma 4's global layers: the first pairs turn with exponents over the whole head (not over the rotated
    # part, as a partial rotary head's do), the others at frequency 0, in transformers' arithmetic.
    angles = int(rope.proportion * head_dim // 2)
    rotated = 1.0 / (rope.theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat((rotated, torch.zeros(head_dim // 2 - angles))) / rope.factor


def _yarn_scaled(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    # High frequencies (many turns within the original context) are kept, low ones divided by
    # `factor`, with a linear ramp between the dimensions that turn beta_fast and beta_slow times.
    def dimension(turns: float) -> float:
        return head_dim * math.log(rope.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dimension(rope.beta_fast), dimension(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    wavelengths = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    return 1.0 / (rope.factor * wavelengths) * (1 - keep) + 1.0 / wavelengths * keep


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding:
    """Precomputed cos/sin tables [max_positions, head_dim] for positions [0, max_positions)."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device, dtype: torch.dtype):
        inv_freq = inverse_frequencies(rope, head_dim)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # Computed in fp32 and then cast, as the reference implementation does (on the same shape).
        scale = magnitude(rope)
        cos, sin = (emb.cos(), emb.sin()) if scale == 1.0 else (emb.cos() * scale, emb.sin() * scale)
        kept = head_dim // 2 - inv_freq.shape[0]
        if kept:
            cos, sin = _with_pass_through(cos, 1.0, kept), _with_pass_through(sin, 0.0, kept)
        self.cos = cos.to(device=device, dtype=dtype)
        # rotate_half(x) * sin == swap_halves(x) * sin_signed, bit for bit (negation is exact),
        # with one op fewer on the decode path.
        half = head_dim // 2
        sign = torch.cat((-torch.ones(half), torch.ones(half)))
        self.sin_signed = (sin * sign).to(device=device, dtype=dtype)


def _with_pass_through(table: torch.Tensor, value: float, kept: int) -> torch.Tensor:
    """A partial rotary head's table: each half's rotated pairs, then its `kept` pass-through pairs at `value`
    (model/partial_rotary.py's order). cos 1 and sin 0, unscaled: x * 1 + y * 0 == x exactly, as if those dims
    were never rotated."""
    first, second = table.chunk(2, dim=-1)
    rest = torch.full((table.shape[0], kept), value)
    return torch.cat((first, rest, second, rest), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by the position tables [T, 1, head_dim]."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin_signed
