"""What reading a `gemma3` GGUF file needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter stores Gemma's norm weights as 1 + w (its RMSNorm multiplies by the weight as
is); the Hugging Face layout keeps w, so 1 is taken off again here, as transformers' own GGUF loader
does. Several Gemma 3 numbers are not in the file's metadata because llama.cpp fixes them in code:
the local layers' RoPE base (10k), the layer pattern (every sixth layer global) unless the file lists
one, and the query scale (head_dim, but hidden / heads on the 27B).
"""

from __future__ import annotations

from typing import Any

from engine.config.gemma3 import DEFAULT_PATTERN, DEFAULT_THETA, FULL, SLIDING

# Gemma's layer tensors whose names differ from the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GEMMA3_27B = (5376, 32)  # (hidden, heads): the one size whose query scale is hidden / heads


def is_shifted_norm(hf_name: str) -> bool:
    """A norm weight llama.cpp stored as 1 + w."""
    return hf_name.endswith("norm.weight")


def config_fields(field, need, num_layers: int) -> dict[str, Any]:
    """The Gemma 3 entries of config.json, from the GGUF's metadata (`field(key, default)` reads
    "gemma3.<key>"; `need(key)` raises if it is absent)."""
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(field("attention.key_length", hidden // heads))
    pattern = field("attention.sliding_window_pattern", None)
    if isinstance(pattern, list) and len(pattern) == num_layers:  # newer files: one bool per layer
        types = [SLIDING if swa else FULL for swa in pattern]
    else:
        every = int(pattern) if isinstance(pattern, int) and pattern > 0 else DEFAULT_PATTERN
        types = [SLIDING if (i + 1) % every else FULL for i in range(num_layers)]
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field("rope.freq_base", DEFAULT_THETA[FULL]))}
    if field("rope.scaling.type", None) == "linear":
        full_rope = {**full_rope, "rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    cap = field("final_logit_softcapping", None)
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": types,
        "rope_parameters": {FULL: full_rope, SLIDING: {"rope_type": "default", "rope_theta": DEFAULT_THETA[SLIDING]}},
        "query_pre_attn_scalar": hidden // heads if (hidden, heads) == _GEMMA3_27B else head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": float(cap) if cap is not None else None,
        "attn_logit_softcapping": None,
    }
