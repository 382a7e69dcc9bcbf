"""What a Ministral 3 config.json adds to the Llama-family numbers.

A Ministral 3 repository is a multimodal "mistral3" config (Mistral3ForConditionalGeneration: a Pixtral
vision tower, a projector and a text model); kvchat runs its text_config, as it does a multimodal Gemma 3's.
The same wrapper holds Mistral Small 3.x's plain "mistral" text model, which transformers assumes when
text_config names no model_type. The text model is tied to its embeddings as the wrapper's
tie_word_embeddings says (transformers ties Mistral3ForConditionalGeneration's lm_head by the top-level
flag), else as the text_config's.

Ministral 3's text model ("ministral3", also saved bare as Ministral3ForCausalLM) is Mistral's decoder with
YaRN RoPE and Llama 4's attention temperature: after RoPE, q is multiplied by
1 + beta * ln(1 + floor(position / original_max_position_embeddings)) (model/temperature.py), beta being
rope_parameters' llama_4_scaling_beta. transformers reads both numbers from rope_parameters and fails
without them, so a config that lacks one is refused.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError

_DEFAULT_TEXT = "mistral"  # what Mistral3Config builds when text_config names no model_type


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's config of a multimodal "mistral3" config."""
    inner = raw.get("text_config")
    if not isinstance(inner, dict):
        raise ModelError("The Mistral 3 config.json has no text_config.")
    tied = raw.get("tie_word_embeddings", inner.get("tie_word_embeddings", True))
    return {"model_type": _DEFAULT_TEXT, **inner, "tie_word_embeddings": tied}


def temperature(params: dict[str, Any]) -> tuple[float, int]:
    """(beta, length) of Ministral 3's attention temperature, from its rope_parameters."""
    beta, length = params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings")
    if beta is None or not length:
        raise ModelError("The Ministral 3 config.json's rope_parameters lack llama_4_scaling_beta or "
                         "original_max_position_embeddings, which set its attention temperature.")
    return float(beta), int(length)
