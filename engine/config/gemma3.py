"""What a Gemma 3 (text) config.json adds to the Llama-family numbers.

Gemma 3 interleaves sliding-window layers (window 512 on the released models) with full-attention
ones (every sixth layer, or `layer_types` spelled out), and gives each kind its own RoPE: base 10k for
the local layers, 1M (with linear scaling on the larger models) for the global ones. Its attention
scales by `query_pre_attn_scalar`, its MLP is GELU-tanh gated and its embeddings are scaled by
sqrt(hidden). Read here from both spellings transformers has written (4.x: rope_theta,
rope_local_base_freq, rope_scaling; 5.x: rope_parameters keyed by layer type). A multimodal Gemma 3
directory ("gemma3") carries the same numbers under text_config.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_PATTERN = 6  # every sixth layer is global when layer_types is not written out
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a multimodal "gemma3" config's text_config, else `raw` itself."""
    if raw.get("model_type") == "gemma3":
        inner = raw.get("text_config")
        if not isinstance(inner, dict):
            raise ModelError("The Gemma 3 config.json has no text_config.")
        return {**inner, "model_type": "gemma3_text"}
    return raw


def layer_types(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = raw.get("layer_types")
    if types is None:
        pattern = int(raw.get("sliding_window_pattern", DEFAULT_PATTERN))
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= {SLIDING, FULL}:
        raise ModelError("The Gemma 3 config.json's layer_types do not list one known kind per layer.")
    return tuple(types)


def rope_parameters(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{layer kind: rope parameters (rope_theta, rope_type, factor...)}, as transformers 5 writes them."""
    nested = raw.get("rope_parameters")
    if isinstance(nested, dict) and (FULL in nested or SLIDING in nested):
        params = {kind: dict(nested.get(kind) or {}) for kind in (FULL, SLIDING)}
    else:
        # The older spelling: one rope_theta / rope_scaling for the global layers, a local base apart.
        flat = dict(nested or {})
        full = {**(raw.get("rope_scaling") or {}), **flat}
        full.setdefault("rope_theta", raw.get("rope_theta", DEFAULT_THETA[FULL]))
        params = {FULL: full, SLIDING: {"rope_theta": raw.get("rope_local_base_freq", DEFAULT_THETA[SLIDING])}}
    for kind in (FULL, SLIDING):
        params[kind].setdefault("rope_theta", DEFAULT_THETA[kind])
    return params


def unsupported(raw: dict[str, Any]) -> str | None:
    """Why kvchat cannot run this Gemma 3 config exactly (one phrase), or None."""
    if raw.get("attn_logit_softcapping") is not None:
        return "attention logit soft-capping (a Gemma 2 feature)"
    if raw.get("use_bidirectional_attention"):
        return "bidirectional attention (an embedding model)"
    return None
