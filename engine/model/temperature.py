"""Llama 4's attention temperature, as Ministral 3 uses it: q at position p is multiplied, after RoPE, by
1 + beta * ln(1 + floor(p / length)) (length: YaRN's original_max_position_embeddings, 16384 on the released
models). It is exactly 1 below `length` and grows by steps after it (1.07 from 16k, 1.22 from 128k
positions), sharpening attention where YaRN stretched the positions.

One table for every position of the context, made once: a chunk or a decode step reads its rows
(CausalLM), and so does the fused C step (cpu/csrc/decode_step.c), so that every path multiplies by the
same numbers.
"""

from __future__ import annotations

import torch

from engine.config.model import AttentionTemperature


def temperature_table(temperature: AttentionTemperature, positions: int, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor:
    """[positions] multipliers of q. Computed as transformers' get_llama_4_attn_scale computes them (the same
    fp32 ops on the int64 positions), then cast to the model's dtype, as it casts them to q's."""
    position = torch.arange(positions, dtype=torch.int64)
    scale = 1 + temperature.beta * torch.log(1 + torch.floor(position / temperature.length))
    return scale.to(device=device, dtype=dtype)
