"""What a Qwen3.5 config.json (qwen3_5_text, or the multimodal qwen3_5's text_config) adds to the Llama-family
numbers: its hybrid layout and its RoPE.

Three layers in four (layer_types, else every full_attention_interval-th layer full) are Gated DeltaNet
linear attention (recurrent/gated_deltanet.py: linear_num_key_heads / linear_num_value_heads heads of
linear_key_head_dim / linear_value_head_dim, a causal convolution of linear_conv_kernel_dim taps over q, k
and v); the others are gated full attention with q/k norms (model/qwen35.py). Only the full layers keep K/V.

The full layers rotate the first partial_rotary_factor (default 0.25) of each head's dims (model/
partial_rotary.py). transformers runs Qwen3.5's RoPE as multimodal RoPE (mrope_section): three position ids
per token (time, height, width) each turning its own interleaved share of the frequencies. A text token's
three ids are its position, so every share turns by the same angle: ordinary RoPE on the rotated dims.

The multimodal wrapper ties its lm_head to the embeddings as its own tie_word_embeddings says (default
false), not its text_config's: transformers ties Qwen3_5ForConditionalGeneration by the top-level flag.

The mixture-of-experts variant (qwen3_5_moe_text, the multimodal qwen3_5_moe's text model) has the same layers
with every MLP a SparseMoE (model/moe.py): a router over num_experts experts of moe_intermediate_size, the
num_experts_per_tok best renormalised (transformers always does), plus a shared expert of
shared_expert_intermediate_size scaled by a sigmoid gate. Its config has no dense intermediate_size: the shared
expert's stands for it.
"""

from __future__ import annotations

from typing import Any

from engine.config.hybrid import ATTENTION, GATED_DELTANET, HybridLayers
from engine.config.rope import RopeConfig, check_partial_rotary
from engine.errors import ModelError

MODEL_TYPE = "qwen3_5_text"
MOE_MODEL_TYPE = "qwen3_5_moe_text"
MODEL_TYPES = (MODEL_TYPE, MOE_MODEL_TYPE)
_KINDS = {"linear_attention": GATED_DELTANET, "full_attention": ATTENTION}
# Qwen3_5TextConfig's defaults where the generic reader (config/model.py) would assume others.
_DEFAULTS = {"head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}
_MOE_DEFAULTS = {"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                 "shared_expert_intermediate_size": 512}
DEFAULT_PARTIAL_ROTARY = 0.25


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's config of a multimodal "qwen3_5" or "qwen3_5_moe" config."""
    inner = raw.get("text_config")
    if not isinstance(inner, dict):
        raise ModelError("The Qwen3.5 config.json has no text_config.")
    model_type = MOE_MODEL_TYPE if raw.get("model_type") == "qwen3_5_moe" else MODEL_TYPE
    return {**inner, "model_type": model_type, "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False))}


def with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    raw = {**_DEFAULTS, **(_MOE_DEFAULTS if raw.get("model_type") == MOE_MODEL_TYPE else {}),
           **{k: v for k, v in raw.items() if v is not None}}
    if raw["model_type"] == MOE_MODEL_TYPE:
        raw.setdefault("intermediate_size", raw["shared_expert_intermediate_size"])
    return raw


def rope(raw: dict[str, Any], head_dim: int) -> RopeConfig:
    # transformers 5 writes rope_parameters (partial_rotary_factor inside); older configs the top level.
    params = {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if rope_type != "default":
        raise ModelError(f"This Qwen3.5 model scales its RoPE ({rope_type!r}), which kvchat does not run.")
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY)))
    check_partial_rotary(head_dim, partial)
    return RopeConfig(theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
                      partial_rotary_factor=partial)


def config_fields(raw: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """ModelConfig fields of a qwen3_5_text config beyond the generic ones."""
    if raw.get("attention_bias"):
        raise ModelError("This Qwen3.5 model has biased attention projections (attention_bias), which kvchat "
                         "does not run.")
    if (activation := raw.get("hidden_act", "silu")) != "silu":
        raise ModelError(f"This Qwen3.5 model uses {activation!r} where kvchat runs only silu.")
    return {"hybrid": layout(raw, num_layers), "sliding_window": None, "qkv_bias": False, "qk_norm": False}


def layout(raw: dict[str, Any], num_layers: int) -> HybridLayers:
    kinds = raw.get("layer_types")
    if kinds is None:
        interval = int(raw.get("full_attention_interval") or 4)
        kinds = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(num_layers)]
    if len(kinds) != num_layers or not set(kinds) <= set(_KINDS):
        raise ModelError(f"The model's layer_types do not describe its {num_layers} layers as linear or full "
                         "attention.")
    key_heads = int(raw.get("linear_num_key_heads", 16))
    value_heads = int(raw.get("linear_num_value_heads", 32))
    if value_heads % key_heads:
        raise ModelError(f"The model's {value_heads} linear-attention value heads are not groups of its "
                         f"{key_heads} key heads.")
    key_dim, value_dim = int(raw.get("linear_key_head_dim", 128)), int(raw.get("linear_value_head_dim", 128))
    return HybridLayers(mixers=tuple(_KINDS[kind] for kind in kinds),
                        conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
                        conv_channels=2 * key_heads * key_dim + value_heads * value_dim,
                        key_heads=key_heads, value_heads=value_heads, key_head_dim=key_dim, value_head_dim=value_dim)
