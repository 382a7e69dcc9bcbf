"""What a Phi-3 / Phi-4-mini config.json adds to the Llama-family numbers: its RoPE.

Phi-3 rotates only the first int(head_dim * partial_rotary_factor) dims of each head (Phi-4-mini: 0.75;
the others pass through: model/partial_rotary.py). Its long-context models scale the rotation with
LongRoPE: one frequency divisor per rotary pair, a list for short contexts and a list for long ones, and
cos/sin multiplied by sqrt(1 + ln(factor) / ln(original context)), factor being max_position_embeddings /
original_max_position_embeddings unless the config sets it.

transformers switches from the short list to the long one while it runs, once a sequence passes
original_max_position_embeddings (and leaves the keys it cached rotated by the short one). kvchat picks one
list for everything it runs, as llama.cpp does: the long one when its context window (ModelConfig.
context_window: max_position_embeddings, capped by a sliding window) passes the original context, else the
short one. So a Phi-4-mini (131072 > 4096) runs its long factors from the first token: its logits equal
transformers' on sequences longer than 4096 tokens, and on shorter ones differ where transformers would
still use the short list. A model whose window stays within the original context equals transformers'
everywhere.
"""

from __future__ import annotations

import math
from typing import Any

from engine.config.rope import check_partial_rotary
from engine.errors import ModelError

# Phi3Config's defaults where a config.json leaves a number out.
DEFAULT_ORIGINAL_CONTEXT = 4096
DEFAULT_MAX_POSITIONS = 4096
DEFAULT_EPS = 1e-5
# Older Phi-3 configs name longrope "su" or "yarn"; transformers reads both as longrope.
_LONGROPE_NAMES = ("longrope", "su", "yarn")


def config_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields whose Phi-3 defaults differ from the Llama family's."""
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ModelError(f"This Phi-3 model's MLP uses {activation!r}, which kvchat does not run (only silu).")
    return {"max_position_embeddings": int(raw.get("max_position_embeddings", DEFAULT_MAX_POSITIONS)),
            "rms_norm_eps": float(raw.get("rms_norm_eps", DEFAULT_EPS))}


def rope_fields(raw: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """The RopeConfig fields of a Phi-3 config (long_context is chosen later, for the context window)."""
    # transformers 5 writes "rope_parameters"; older configs write rope_theta + rope_scaling, and
    # partial_rotary_factor at the top level.
    params = {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if rope_type not in ("default", *_LONGROPE_NAMES):
        raise ModelError(f"Unsupported Phi-3 RoPE scaling {rope_type!r}: kvchat supports default and longrope.")
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    check_partial_rotary(head_dim, partial)
    rotary = int(head_dim * partial)
    fields: dict[str, Any] = {"theta": float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
                              "partial_rotary_factor": partial}
    if rope_type == "default":
        return fields
    # Phi3Config's own original_max_position_embeddings (default 4096) overrides the RoPE parameters' one.
    original = int(raw.get("original_max_position_embeddings") or DEFAULT_ORIGINAL_CONTEXT)
    factor = params.get("factor")
    if factor is None:  # as transformers computes it: the ratio of the two contexts
        factor = int(raw.get("max_position_embeddings", DEFAULT_MAX_POSITIONS)) / original
    attention_factor = params.get("attention_factor")
    return {**fields, "type": "longrope", "factor": float(factor), "original_max_position_embeddings": original,
            "attention_factor": float(attention_factor) if attention_factor is not None else None,
            "short_factor": _factors(params, "short_factor", rotary),
            "long_factor": _factors(params, "long_factor", rotary)}


def uses_long_factors(context_window: int, original_context: int) -> bool:
    """Whether the engine runs longrope's long factors: its window passes the original context (see above)."""
    return context_window > original_context


def attention_factor(factor: float, original_context: int) -> float:
    """What cos/sin are multiplied by when the config does not say: transformers' formula, in its order."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_context))


def _factors(params: dict[str, Any], key: str, rotary: int) -> tuple[float, ...]:
    values = params.get(key)
    if not isinstance(values, (list, tuple)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values):
        raise ModelError(f"The model's longrope {key} is not a list of positive numbers.")
    if len(values) != rotary // 2:
        raise ModelError(f"The model's longrope {key} lists {len(values)} numbers, not one for each of its "
                         f"{rotary // 2} rotary pairs.")
    return tuple(float(v) for v in values)
