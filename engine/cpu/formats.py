"""The weight formats the CPU kernels run (csrc/block_quant.h) and the tensors each is stored as.

- q4_1, q8_0: the quants in `qs` and fp32 per-block scales `d` (and minimums `m`), split at conversion.
- q4_0, q5_0, q5_1 and the K-quants q2_k..q6_k: `qs` holds GGUF's own blocks byte for byte, uint8
  [N, K / weights-per-block * bytes-per-block], so a weight costs exactly what the format costs.
- bf16, f16: `qs` is the 2-byte weight matrix [N, K] itself (torch.bfloat16 / torch.float16).

A format's name is its GGUF type's name in lower case (GGMLQuantizationType.Q4_K -> "q4_k").
"""

from __future__ import annotations

import torch

BLOCK = 32  # the kernels' unit: K must be a multiple of it
SPLIT_PARTS = {"q4_1": ("qs", "d", "m"), "q8_0": ("qs", "d")}
# (weights, bytes) per block of GGUF's block layouts kept as they are.
RAW_BLOCKS = {"q4_0": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84), "q3_k": (256, 110),
              "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
HALF_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
FORMATS = (*SPLIT_PARTS, *RAW_BLOCKS, *HALF_DTYPES)


def stored_parts(fmt: str) -> tuple[str, ...]:
    """The tensors a weight in `fmt` is stored as ("qs", and for q4_1/q8_0 "d" and "m")."""
    return SPLIT_PARTS.get(fmt, ("qs",))


def in_features(fmt: str, qs: torch.Tensor, d: torch.Tensor | None) -> int:
    """K, the weight matrix's column count, from its stored tensors."""
    if fmt in SPLIT_PARTS:
        return d.shape[1] * BLOCK
    if fmt in RAW_BLOCKS:
        weights, size = RAW_BLOCKS[fmt]
        return qs.shape[1] // size * weights
    return qs.shape[1]

