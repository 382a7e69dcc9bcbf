"""What an LFM2 / LFM2.5 config.json (model_type "lfm2") adds to the Llama-family numbers.

LFM2 is a hybrid: each layer's token mixer is a short convolution ("conv" in layer_types; recurrent/
short_conv.py) or GQA attention with per-head q/k norms ("full_attention"). Older configs list the attention
layers by index instead (full_attn_idxs); with neither, every layer attends, as Lfm2Config builds it. Every
layer then runs the same gated SwiGLU MLP, whose width transformers derives from intermediate_size when
block_auto_adjust_ff_dim is set (ffn_width below, in its order of operations).

transformers reads a few keys under other names than the Llama family's, and defaults others differently
(Lfm2Config): norm_eps (1e-5), tie_embedding and block_ff_dim (older spellings that win over
tie_word_embeddings and intermediate_size), RoPE theta 1e6, 8 KV heads, a context of 128000, tied
embeddings. `normalized` writes them as the Llama family's keys, so ModelConfig reads them as it reads any
model's. A sliding_window, which transformers' LFM2 does not apply, is ignored as it ignores it.
"""

from __future__ import annotations

from typing import Any

from engine.config.hybrid import ATTENTION, SHORT_CONV, HybridLayers
from engine.errors import ModelError

# LFM2 variants kvchat does not run, by model_type: what to say instead of "unsupported architecture".
REFUSED = {
    "lfm2_moe": "LFM2's mixture-of-experts models (lfm2_moe) are not ones kvchat runs; use a dense LFM2 or "
                "LFM2.5 model.",
    "lfm2_vl": "LFM2's vision-language models (lfm2_vl) are not ones kvchat runs; use a text-only LFM2 or "
               "LFM2.5 model.",
}
_MIXERS = {"conv": SHORT_CONV, "full_attention": ATTENTION}
# Lfm2Config's defaults, where they differ from what ModelConfig assumes of a config.json without the key.
_DEFAULTS = {"rms_norm_eps": 1e-5, "num_key_value_heads": 8, "max_position_embeddings": 128_000,
             "tie_word_embeddings": True, "intermediate_size": 12288}
DEFAULT_THETA = 1_000_000.0


def normalized(raw: dict[str, Any]) -> dict[str, Any]:
    """An lfm2 config.json with LFM2's keys and defaults written as the Llama family's: the MLP's actual width as
    intermediate_size, norm_eps as rms_norm_eps, no biases but the short convolutions' (hybrid_layers), no
    sliding window, SiLU."""
    out = {**raw}
    if raw.get("norm_eps") is not None:
        out["rms_norm_eps"] = raw["norm_eps"]
    else:
        out.pop("rms_norm_eps", None)  # not a key Lfm2Config reads
    if raw.get("tie_embedding") is not None:
        out["tie_word_embeddings"] = raw["tie_embedding"]
    if raw.get("block_ff_dim") is not None:
        out["intermediate_size"] = raw["block_ff_dim"]
    for key, value in _DEFAULTS.items():
        if out.get(key) is None:
            out[key] = value
    theta = (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta"))
    out["rope_theta"] = float(theta) if theta is not None else DEFAULT_THETA
    out["intermediate_size"] = ffn_width(out)
    out.update(attention_bias=False, mlp_bias=False, sliding_window=None, hidden_act="silu")
    return out


def ffn_width(raw: dict[str, Any]) -> int:
    """The MLP's intermediate width, as transformers' Lfm2MLP sizes it: with block_auto_adjust_ff_dim, two thirds
    of intermediate_size, then, if block_ffn_dim_multiplier is set, that many times it rounded up to a multiple of
    block_multiple_of (llama.cpp's converter rounds up even without a multiplier; a GGUF states its width)."""
    width = int(raw["intermediate_size"])
    if not raw.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple = int(raw.get("block_multiple_of", 256))
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def layer_types(raw: dict[str, Any], num_layers: int) -> list[str]:
    """Each layer's kind, "conv" or "full_attention", as Lfm2Config reads them."""
    kinds = raw.get("layer_types")
    if kinds is None:
        attention = raw.get("full_attn_idxs")
        attention = set(range(num_layers)) if attention is None else {int(i) for i in attention}
        kinds = ["full_attention" if i in attention else "conv" for i in range(num_layers)]
    if len(kinds) != num_layers:
        raise ModelError(f"The model's layer_types lists {len(kinds)} layers, not its {num_layers}.")
    unknown = sorted(set(kinds) - set(_MIXERS))
    if unknown:
        raise ModelError(f"This LFM2 model has {unknown[0]!r} layers, which kvchat does not run (only conv and "
                         "full_attention).")
    return list(kinds)


def hybrid_layers(raw: dict[str, Any], num_layers: int) -> HybridLayers:
    """The layout of an lfm2 config: its token mixer per layer; the convolutions' taps and bias over hidden_size
    channels."""
    kernel = int(raw.get("conv_L_cache", 3))
    if kernel < 1:
        raise ModelError(f"The model's short convolutions have {kernel} taps (conv_L_cache), not at least one.")
    return HybridLayers(mixers=tuple(_MIXERS[kind] for kind in layer_types(raw, num_layers)), conv_kernel=kernel,
                        conv_channels=int(raw["hidden_size"]), conv_bias=bool(raw.get("conv_bias", False)))
