"""What reading a `gemma4` GGUF file (Gemma 4's text model) needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter keeps Gemma 4's norm weights as they are (unlike Gemma 3's, no 1 + w). Its layout varies
layer by layer, and the metadata says so in llama.cpp's terms, turned back here into a Hugging Face gemma4_text
config (config/gemma4.py reads it):
- attention.sliding_window_pattern: one bool per layer (true: sliding);
- attention.key_length / key_length_swa: the full and the sliding layers' head sizes; head_count_kv and
  feed_forward_length may be one number per layer (the full layers' KV heads; a double-wide MLP on the
  layers that share K/V), attention.shared_kv_layers the number of last layers that compute no K/V;
- a full layer without attn_v computes its values from its keys' projection (attention_k_eq_v);
- the full layers' proportional RoPE: rope.dimension_count is their whole head, and a rope_freqs tensor
  holds a factor per rotated pair, 1 for the pairs Hugging Face rotates and a huge one (a frequency of
  nothing) for the rest; the rotated share is read from it;
- the per-layer inputs: per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm and, per layer,
  inp_gate, proj, post_norm, under embedding_length_per_layer_input; each layer's scalar layer_output_scale;
- the experts beside the MLP (the 26B-A4B), under expert_count, expert_used_count, expert_feed_forward_length:
  the router ffn_gate_inp with its input's scale ffn_gate_inp.scale, the experts stacked in ffn_gate_up_exps
  (gate's rows first; older files: ffn_gate_exps and ffn_up_exps) and ffn_down_exps (read one expert at a time
  by gguf/reader.py), each expert's scale as ffn_down_exps.scale, and the norms pre_ffw_norm_2 (the experts'
  input), post_ffw_norm_1 (the MLP's output) and post_ffw_norm_2 (the experts' output). llama.cpp always
  renormalises the chosen experts' weights, as transformers does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.errors import ModelError
from engine.config.gemma3 import FULL, SLIDING

# Gemma 4's layer tensors whose names differ from the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
    "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
    "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
}
EXPERTS = "experts."  # where a layer's experts are under Hugging Face's names (beside mlp., not in it)
GLOBAL_TENSORS = {
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
ROPE_FREQS = "rope_freqs.weight"  # config (the full layers' rotated share), not a weight
_UNROTATED = 1e20  # a frequency factor at least this large leaves its pair as is (the converter writes 1e30)
DEFAULT_SLIDING_THETA = 10_000.0


def _per_layer(value: Any, num_layers: int, what: str) -> list[int]:
    if isinstance(value, list):
        if len(value) != num_layers:
            raise ModelError(f"The GGUF file's {what} lists {len(value)} values for {num_layers} layers.")
        return [int(v) for v in value]
    return [int(value)] * num_layers


def _rotated_share(rope_freqs, head_dim: int) -> float:
    """The full layers' partial_rotary_factor, from the rope_freqs factors llama.cpp's converter writes."""
    from gguf.quants import dequantize

    factors = np.asarray(dequantize(rope_freqs.data, rope_freqs.tensor_type), dtype=np.float64).reshape(-1)
    rotated = int(np.sum(factors < _UNROTATED))
    if factors.size != head_dim // 2 or not np.all(factors[:rotated] == 1.0) or not np.all(factors[rotated:] >= _UNROTATED):
        raise ModelError("The GGUF file's rope_freqs are not Gemma 4's proportional RoPE (its rotated pairs first, "
                         "unscaled); kvchat does not run other RoPE frequency factors.")
    return 2 * rotated / head_dim


def config_fields(field, need, num_layers: int, tensors) -> dict[str, Any]:
    """The Gemma 4 entries of config.json, from the GGUF's metadata (`field(key, default)` reads
    "gemma4.<key>"; `need(key)` raises if it is absent) and tensor table."""
    by_name = {t.name: t for t in tensors}
    moe = _moe_fields(field, need, num_layers, by_name)
    pattern = need("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != num_layers:
        raise ModelError("The GGUF file's gemma4.attention.sliding_window_pattern is not one bool per layer.")
    types = [SLIDING if swa else FULL for swa in pattern]
    full_dim = int(need("attention.key_length"))
    swa_dim = int(field("attention.key_length_swa", full_dim))
    if int(field("attention.value_length", full_dim)) != full_dim or int(field("attention.value_length_swa", swa_dim)) != swa_dim:
        raise ModelError("The GGUF file's Gemma 4 value head sizes differ from its key head sizes.")
    kv = _per_layer(need("attention.head_count_kv"), num_layers, "gemma4.attention.head_count_kv")
    ff = _per_layer(need("feed_forward_length"), num_layers, "gemma4.feed_forward_length")
    shared = int(field("attention.shared_kv_layers", 0))
    first_shared = num_layers - shared
    wide = any(ff[i] != ff[0] for i in range(num_layers))
    if any(ff[i] != ff[0] for i in range(first_shared)) or any(ff[i] != 2 * ff[0] for i in range(first_shared, num_layers) if wide):
        raise ModelError("The GGUF file's Gemma 4 MLP widths are neither one width nor double on the K/V-sharing layers.")
    swa_kv = next((kv[i] for i, kind in enumerate(types) if kind == SLIDING), kv[0])
    computing = range(first_shared)  # the layers that compute their own K/V
    k_eq_v = [f"blk.{i}.attn_v.weight" not in by_name for i in computing]
    if any(k_eq_v[i] and types[i] == SLIDING for i in computing):
        raise ModelError("The GGUF file's Gemma 4 sliding layers lack their V projection.")
    full_k_eq_v = {k_eq_v[i] for i in computing if types[i] == FULL}
    if len(full_k_eq_v) > 1:
        raise ModelError("The GGUF file's Gemma 4 full layers mix values from their own projection and their keys'.")
    per_layer = {str(i): {"head_dim": full_dim if kind == FULL else swa_dim, "num_key_value_heads": kv[i]}
                 for i, kind in enumerate(types) if (full_dim if kind == FULL else swa_dim, kv[i]) != (swa_dim, swa_kv)}
    # RoPE: the full layers' (rope.freq_base, proportional through rope_freqs), the sliding layers' plain one.
    if int(field("rope.dimension_count", full_dim)) != full_dim or int(field("rope.dimension_count_swa", swa_dim)) != swa_dim:
        raise ModelError("The GGUF file's Gemma 4 RoPE dimension counts are not whole heads; kvchat runs only "
                         "the proportional RoPE llama.cpp's converter writes.")
    share = _rotated_share(by_name[ROPE_FREQS], full_dim) if ROPE_FREQS in by_name else 1.0
    rope = {FULL: {"rope_type": "proportional", "partial_rotary_factor": share,
                   "rope_theta": float(need("rope.freq_base"))},
            SLIDING: {"rope_type": "default", "rope_theta": float(field("rope.freq_base_swa", DEFAULT_SLIDING_THETA))}}
    per_layer_input = int(field("embedding_length_per_layer_input", 0))
    embed = by_name.get("per_layer_token_embd.weight")
    cap = field("final_logit_softcapping", None)
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "intermediate_size": ff[0],
        "use_double_wide_mlp": wide,
        "num_key_value_heads": swa_kv,
        "head_dim": swa_dim,
        "per_layer_config": per_layer,
        "attention_k_eq_v": bool(full_k_eq_v and full_k_eq_v.pop()),
        "num_kv_shared_layers": shared,
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": types,
        "rope_parameters": rope,
        "hidden_size_per_layer_input": per_layer_input,
        "vocab_size_per_layer_input": int(embed.shape[1]) if per_layer_input and embed is not None else None,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": float(cap) if cap is not None else None,
        **moe,
    }


def _moe_fields(field, need, num_layers: int, by_name) -> dict[str, Any]:
    """The experts' entries of config.json (enable_moe_block False when the file has none). transformers runs them
    in every layer or none; llama.cpp would run a layer without a router as a dense one."""
    routed = [f"blk.{i}.ffn_gate_inp.weight" in by_name for i in range(num_layers)]
    if not any(routed) and not field("expert_count", 0):
        return {"enable_moe_block": False}
    if not all(routed):
        raise ModelError("The GGUF file's Gemma 4 layers do not all have a router for its experts; kvchat runs the "
                         "experts in every layer or none, as transformers does.")
    return {"enable_moe_block": True, "num_experts": int(need("expert_count")),
            "top_k_experts": int(need("expert_used_count")),
            "moe_intermediate_size": int(need("expert_feed_forward_length"))}
