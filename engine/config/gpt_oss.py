"""gpt-oss's config.json fields beyond the Llama family's (read by config/model.py)."""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError


def config_fields(raw: dict[str, Any], layers: int) -> dict[str, Any]:
    """gpt-oss: every layer's attention biased (o_proj's too) and sunk, the sliding layers' 128-token window a
    mask per layer (not a cap on the context), its clamped SwiGLU; its experts in every layer are MoEConfig's
    (config/model.py adds them)."""
    kinds = raw.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if len(kinds) != layers or set(kinds) - {"sliding_attention", "full_attention"}:
        raise ModelError(f"The model's layer_types do not describe its {layers} layers as sliding or full attention.")
    window = int(raw.get("sliding_window") or 128)
    return {
        "sliding_window": None,
        "layer_windows": tuple(window if kind == "sliding_attention" else None for kind in kinds),
        "o_bias": bool(raw.get("attention_bias", True)),
        "qkv_bias": bool(raw.get("attention_bias", True)),
        "attention_sinks": True,
        "hidden_act": "swiglu_oai",
        "swiglu_alpha": float(raw.get("swiglu_alpha", 1.702)),
        "swiglu_limit": float(raw.get("swiglu_limit", 7.0)),
        # no intermediate_size of a dense MLP: every layer's MLP is the experts
    }
