"""The weight formats the CPU kernels run (csrc/block_quant.h) and the tensor each is stored as.

- q4_0, q4_1, q5_0, q5_1, q8_0, mxfp4, iq4_nl, iq4_xs and the K-quants q2_k..q6_k: `qs` holds GGUF's own
  blocks byte for byte, uint8 [N, K / weights-per-block * bytes-per-block], so a weight costs exactly what the
  format costs and a GGUF file's matrices are read where the file is mapped (gguf/reader.py), never copied.
- bf16, f16: `qs` is the 2-byte weight matrix [N, K] itself (torch.bfloat16 / torch.float16).

A format's name is its GGUF type's name in lower case (GGMLQuantizationType.Q4_K -> "q4_k").
"""

from __future__ import annotations

import torch

BLOCK = 32  # the kernels' unit: K must be a multiple of it
# (weights, bytes) per block of GGUF's block layouts, kept as they are.
RAW_BLOCKS = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
              "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
              "mxfp4": (32, 17),  # gpt-oss's expert format: an E8M0 exponent byte, 16 bytes of e2m1 nibbles
              "iq4_nl": (32, 18), "iq4_xs": (256, 136)}  # the 4-bit imatrix quants: non-linear levels
HALF_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
FORMATS = (*RAW_BLOCKS, *HALF_DTYPES)


def in_features(fmt: str, qs: torch.Tensor) -> int:
    """K, the weight matrix's column count, from its stored tensor."""
    if fmt in RAW_BLOCKS:
        weights, size = RAW_BLOCKS[fmt]
        return qs.shape[1] // size * weights
    return qs.shape[1]
