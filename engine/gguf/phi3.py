"""What reading a `phi3` GGUF file (Phi-3, Phi-4-mini) needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter keeps Phi-3's fused tensors fused: attn_qkv holds q's, k's and v's rows in that order
(as kvchat fuses them) and ffn_up holds gate's rows then up's (2 * feed_forward_length rows; a phi3 file has
no ffn_gate). The q/k rows are not permuted: llama.cpp rotates Phi-3 with NeoX's rotate-half, as Hugging
Face does. A partial rotary model says how many dims of a head it rotates in rope.dimension_count. LongRoPE's
two factor lists are the F32 tensors rope_factors_long and rope_factors_short, with
rope.scaling.original_context_length and rope.scaling.attn_factor (what cos/sin are multiplied by; llama.cpp
takes 1 where a file does not say). A sliding window of 0 means none (Phi-4-mini).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import ModelError

# Phi-3's layer tensors whose names differ from the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# Tensors that are config, not weights: each LongRoPE factor list.
ROPE_FACTORS = {"rope_factors_long.weight": "long_factor", "rope_factors_short.weight": "short_factor"}


def config_fields(field, need, tensors, head_dim: int) -> dict[str, Any]:
    """The Phi-3 entries of config.json, from the GGUF's metadata (`field(key, default)` reads "phi3.<key>";
    `need(key)` raises if it is absent) and its RoPE factor tensors."""
    dims = int(field("rope.dimension_count", head_dim))
    partial = dims / head_dim
    if int(head_dim * partial) != dims:  # rounded below (47 * (12 / 47) < 12): the next float up truncates to dims
        partial = math.nextafter(partial, math.inf)
    window = int(field("attention.sliding_window", 0) or 0)
    fields: dict[str, Any] = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                              "partial_rotary_factor": partial, "sliding_window": window or None}
    factors = {ROPE_FACTORS[t.name]: _values(t) for t in tensors if t.name in ROPE_FACTORS}
    if not factors:
        return fields
    if len(factors) != len(ROPE_FACTORS):
        raise ModelError("The GGUF file has one of Phi-3's two RoPE factor tensors (rope_factors_long and "
                         "rope_factors_short), not both.")
    fields["original_max_position_embeddings"] = int(need("rope.scaling.original_context_length"))
    fields["rope_scaling"] = {"rope_type": "longrope", **factors,
                              "attention_factor": float(field("rope.scaling.attn_factor", 1.0))}
    return fields


def _values(tensor) -> list[float]:
    """A factor tensor's numbers. The model summary's table (sources/model_summary.py) has no data, by design:
    it judges a file by its header, and ones of the tensor's length are what that judgement reads (the count)."""
    data = getattr(tensor, "data", None)
    if data is None:
        return [1.0] * int(np.prod(tensor.dims, dtype=np.int64))
    from gguf.quants import dequantize

    try:
        values = dequantize(data, tensor.tensor_type)
    except Exception as exc:
        raise ModelError(f"The GGUF tensor {tensor.name} cannot be decoded ({exc}).") from None
    return [float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]
