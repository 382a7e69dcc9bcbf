"""What reading an `lfm2` GGUF file (LFM2, LFM2.5) needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter writes LFM2's layout in its own terms, turned back here into an lfm2 config.json
(config/lfm2.py reads it) and transformers' tensor names:
- attention.head_count_kv is one number per layer, 0 for a short-convolution layer: that is how llama.cpp
  tells the two kinds apart (there is no layer_types key);
- shortconv.l_cache is the convolution's taps (conv_L_cache), attention.layer_norm_rms_epsilon its norm_eps;
- feed_forward_length is the MLP's actual width (the converter sizes it from block_ff_dim as transformers does,
  and also rounds it up when the config has no multiplier), so the config says to take it as it is;
- each short-convolution layer's taps are shortconv.conv [channels, kernel]: the converter squeezed out the
  middle dim of transformers' [channels, 1, kernel], put back here (`is_conv_taps`);
- the final norm, transformers' model.embedding_norm, is token_embd_norm; q/k rows are not permuted (llama.cpp
  rotates LFM2 with NeoX's rotate-half, as transformers does).
Refused: a file whose attention layers slide (attention.sliding_window, which transformers' LFM2 does not have),
and a non-causal one (LFM2's bidirectional encoders).
"""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError

# LFM2's tensors whose Hugging Face names differ from the Llama family's (gguf/reader.py _LAYER_TENSORS).
LAYER_TENSORS = {
    "attn_norm.weight": "operator_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn_output.weight": "self_attn.out_proj.weight",
    "attn_q_norm.weight": "self_attn.q_layernorm.weight",
    "attn_k_norm.weight": "self_attn.k_layernorm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "shortconv.conv.weight": "conv.conv.weight",
    "shortconv.in_proj.weight": "conv.in_proj.weight",
    "shortconv.out_proj.weight": "conv.out_proj.weight",
}
GLOBAL_TENSORS = {"token_embd_norm.weight": "model.embedding_norm.weight"}


def is_conv_taps(hf_name: str) -> bool:
    """A short convolution's taps, stored [channels, kernel] (Hugging Face: [channels, 1, kernel])."""
    return hf_name.endswith(".conv.conv.weight")


def config_fields(field, need, num_layers: int) -> dict[str, Any]:
    """The LFM2 entries of config.json, from the GGUF's metadata (`field(key, default)` reads "lfm2.<key>";
    `need(key)` raises if it is absent)."""
    kv = need("attention.head_count_kv")
    kv = [int(v) for v in kv] if isinstance(kv, list) else [int(kv)] * num_layers
    if len(kv) != num_layers:
        raise ModelError(f"The GGUF file's lfm2.attention.head_count_kv lists {len(kv)} values for {num_layers} "
                         "layers.")
    attention = sorted({heads for heads in kv if heads})
    if len(attention) > 1:
        raise ModelError("The GGUF file's LFM2 attention layers differ in KV heads, which kvchat does not run.")
    if int(field("attention.sliding_window", 0) or 0) > 0:
        raise ModelError("This LFM2 GGUF's attention layers use a sliding window, which kvchat does not run.")
    if not field("attention.causal", True):
        raise ModelError("This LFM2 GGUF is a bidirectional encoder, not a model that writes text.")
    fields: dict[str, Any] = {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "layer_types": ["full_attention" if heads else "conv" for heads in kv],
        "conv_L_cache": int(need("shortconv.l_cache")),
        "conv_bias": False,  # llama.cpp's LFM2 has no convolution biases
        "norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "intermediate_size": int(need("feed_forward_length")),
        "block_auto_adjust_ff_dim": False,  # the width above is the MLP's own
    }
    if attention:
        fields["num_key_value_heads"] = attention[0]
    return fields
