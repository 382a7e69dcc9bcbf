"""What reading a `mistral3` GGUF file (Ministral 3's text model) needs beyond the Llama family's (gguf/reader.py).

llama.cpp's converter writes Ministral 3 as it writes Llama (the same tensor names, q/k rows permuted for
its RoPE kernel), with rope_parameters spread over metadata keys: rope.scaling.type "yarn",
rope.scaling.factor, rope.scaling.original_context_length (original_max_position_embeddings),
rope.scaling.yarn_beta_fast/yarn_beta_slow, mscale_all_dim as rope.scaling.yarn_log_multiplier (mscale itself
is taken as 1, as llama.cpp takes it) and llama_4_scaling_beta as attention.temperature_scale. llama.cpp
scales q over rope.scaling.original_context_length positions (else the context length), and not at all
without a temperature_scale (Mistral Small 3.x converted as mistral3): beta 0 here, a factor of exactly 1.
Those keys are put back as the config.json transformers' Ministral 3 reads.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError


def config_fields(field, need) -> dict[str, Any]:
    """The Ministral 3 entries of config.json, from the GGUF's metadata (`field(key, default)` reads
    "mistral3.<key>"; `need(key)` raises if it is absent)."""
    scaling = field("rope.scaling.type", None)
    context = int(need("context_length"))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field("rope.freq_base", 10000.0))}
    if scaling == "yarn":
        rope.update(rope_type="yarn", factor=float(need("rope.scaling.factor")),
                    original_max_position_embeddings=int(need("rope.scaling.original_context_length")),
                    beta_fast=float(field("rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=float(field("rope.scaling.yarn_beta_slow", 1.0)))
        if (attention_factor := field("rope.scaling.yarn_attn_factor", None)) is not None:
            rope["attention_factor"] = float(attention_factor)
        if log_multiplier := field("rope.scaling.yarn_log_multiplier", None):
            rope.update(mscale=1.0, mscale_all_dim=float(log_multiplier))
    elif scaling not in (None, "none"):
        raise ModelError(f"Unsupported RoPE scaling {scaling!r} in the GGUF file.")
    rope.setdefault("original_max_position_embeddings", context)
    rope["llama_4_scaling_beta"] = float(field("attention.temperature_scale", 0.0))
    return {"architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "rope_parameters": rope,
            "sliding_window": None}
