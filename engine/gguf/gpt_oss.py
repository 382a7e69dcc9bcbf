"""What reading a `gpt-oss` GGUF file needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter splits gpt-oss's interleaved gate/up columns into ffn_gate_exps and ffn_up_exps
(newer files: one ffn_gate_up_exps, gate rows first), stores every projection Linear-layout like the
other families' (q/k not permuted: its RoPE is rotate-half), and the biases beside them. Some gpt-oss
numbers are fixed in llama.cpp's code, not in the file: sliding and full layers alternate starting with
a sliding one, the SwiGLU clamp (alpha 1.702, limit 7), and YaRN's ramp. The ramp is taken untruncated,
as the model's own config says (`truncate: false`) and transformers computes it.
"""

from __future__ import annotations

from typing import Any

# gpt-oss's layer tensors beyond the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.bias": "mlp.gate.bias",
}
# Stacked experts' biases ([experts, rows]): one vector an expert.
EXPERT_BIASES = {"ffn_gate_exps.bias": "gate_proj", "ffn_up_exps.bias": "up_proj", "ffn_down_exps.bias": "down_proj"}
# Newer files fuse gate and up ([experts, 2 * intermediate, hidden], gate first): split per expert.
FUSED_GATE_UP = {"ffn_gate_up_exps.weight": "weight", "ffn_gate_up_exps.bias": "bias"}


def config_fields(field, need, num_layers: int) -> dict[str, Any]:
    """gpt-oss's entries of config.json from the GGUF's metadata (`field(key, default)` reads
    "gpt-oss.<key>"; `need(key)` raises if it is absent)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field("rope.freq_base", 150000.0))}
    if field("rope.scaling.type", None) == "yarn":
        rope = {**rope, "rope_type": "yarn", "factor": float(need("rope.scaling.factor")),
                "original_max_position_embeddings": int(need("rope.scaling.original_context_length")),
                "beta_fast": float(field("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(field("rope.scaling.yarn_beta_slow", 1.0)), "truncate": False}
        if (factor := field("rope.scaling.yarn_attn_factor", None)) is not None:
            rope["attention_factor"] = float(factor)
    return {
        "num_local_experts": int(need("expert_count")),
        "num_experts_per_tok": int(need("expert_used_count")),
        "intermediate_size": int(need("expert_feed_forward_length")),
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
        "rope_parameters": rope,
        "attention_bias": True,
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
    }
