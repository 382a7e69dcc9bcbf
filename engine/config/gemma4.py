"""What a Gemma 4 (text) config.json adds to Gemma 3's numbers: a layout that varies layer by layer.

Gemma 4 keeps Gemma 3's interleaved sliding/full layers, but its full-attention layers may have a head
size (and, with attention_k_eq_v, a number of KV heads) of their own, written by transformers 5 as
`per_layer_config` ({layer: {"head_dim": ..., "num_key_value_heads": ...}}) and by the released configs as
`global_head_dim` / `num_global_key_value_heads`. Its last `num_kv_shared_layers` layers compute no K/V:
each reuses those of the last earlier layer of its kind (and may have an MLP twice as wide,
use_double_wide_mlp). Every layer may add a per-layer input embedding (hidden_size_per_layer_input), and run
routed experts beside its MLP (enable_moe_block: num_experts, top_k_experts, moe_intermediate_size, read into
ModelConfig.moe).
A multimodal Gemma 4 directory ("gemma4") carries the same numbers under text_config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelError
from engine.config.gemma3 import FULL, SLIDING

DEFAULT_PATTERN = 6
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
DEFAULT_GLOBAL_HEAD_DIM = 512  # transformers' default when a config names neither spelling


@dataclass(frozen=True)
class Gemma4Layers:
    """Per layer: its head size, KV heads, whether its values are its keys' projection (attention_k_eq_v),
    the earlier layer whose K/V it reuses (None: its own), its MLP width; and the per-layer input size
    (0: none) with the vocabulary of its embedding."""

    head_dims: tuple[int, ...]
    kv_heads: tuple[int, ...]
    k_eq_v: tuple[bool, ...]
    kv_sources: tuple[int | None, ...]
    intermediate: tuple[int, ...]
    per_layer_input: int = 0
    per_layer_vocab: int = 0


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a multimodal "gemma4" config's text_config, else `raw` itself."""
    if raw.get("model_type") == "gemma4":
        inner = raw.get("text_config")
        if not isinstance(inner, dict):
            raise ModelError("The Gemma 4 config.json has no text_config.")
        return {**inner, "model_type": "gemma4_text"}
    return raw


def unsupported(raw: dict[str, Any]) -> str | None:
    """Why kvchat cannot run this Gemma 4 config exactly (one phrase), or None."""
    # "vision" makes only image tokens attend both ways (the released multimodal configs): text stays causal.
    if raw.get("use_bidirectional_attention") == "all":
        return "bidirectional attention (use_bidirectional_attention)"
    if raw.get("attention_bias"):
        return "biased attention projections (attention_bias)"
    if (raw.get("hidden_activation") or "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        return f"the MLP activation {raw.get('hidden_activation')!r}"
    return None


def layer_types(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = list(raw.get("layer_types") or
                 [SLIDING if (i + 1) % DEFAULT_PATTERN else FULL for i in range(num_layers)])
    if len(types) != num_layers or not set(types) <= {SLIDING, FULL}:
        raise ModelError("The Gemma 4 config.json's layer_types do not list one known kind per layer.")
    types[-1] = FULL  # transformers forces the last layer global, whatever the config says
    return tuple(types)


def rope_parameters(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{layer kind: rope parameters}; transformers' defaults for a kind the config leaves out."""
    nested = raw.get("rope_parameters") or {}
    return {kind: dict(nested.get(kind) or DEFAULT_ROPE[kind]) for kind in (FULL, SLIDING)}


def layers(raw: dict[str, Any], types: tuple[str, ...]) -> Gemma4Layers:
    num_layers, heads = len(types), int(raw["num_attention_heads"])
    head_dim, kv_heads = int(raw.get("head_dim") or 256), int(raw.get("num_key_value_heads") or heads)
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    overrides = _overrides(raw, types, k_eq_v)
    head_dims = tuple(int(overrides.get(i, {}).get("head_dim", head_dim)) for i in range(num_layers))
    kv = tuple(int(overrides.get(i, {}).get("num_key_value_heads", kv_heads)) for i in range(num_layers))
    if any(heads % n for n in kv) or any(max(kv) % n for n in kv):
        raise ModelError(f"The Gemma 4 config.json's KV heads per layer {sorted(set(kv))} do not divide its "
                         f"{heads} attention heads evenly.")
    sources = kv_sources(types, int(raw.get("num_kv_shared_layers") or 0))
    wide = bool(raw.get("use_double_wide_mlp", False))
    width = int(raw["intermediate_size"])
    return Gemma4Layers(
        head_dims=head_dims, kv_heads=kv,
        k_eq_v=tuple(k_eq_v and kind == FULL for kind in types),
        kv_sources=sources,
        intermediate=tuple(2 * width if wide and src is not None else width for src in sources),
        per_layer_input=int(raw.get("hidden_size_per_layer_input") or 0),
        per_layer_vocab=int(raw.get("vocab_size_per_layer_input") or raw["vocab_size"]))


def kv_sources(types: tuple[str, ...], shared: int) -> tuple[int | None, ...]:
    """Per layer, the layer whose K/V it reuses: for each of the last `shared` layers, the last layer before
    them of the same kind (transformers' "store" layer); None for the others."""
    first = len(types) - shared
    if shared <= 0:
        return (None,) * len(types)
    if first <= 0 or not set(types[first:]) <= set(types[:first]):
        raise ModelError("The Gemma 4 config.json shares K/V with layers of a kind no earlier layer computes.")
    last = {kind: i for i, kind in enumerate(types[:first])}
    return tuple(None if i < first else last[kind] for i, kind in enumerate(types))


def _overrides(raw: dict[str, Any], types: tuple[str, ...], k_eq_v: bool) -> dict[int, dict[str, Any]]:
    """{layer: its head_dim / num_key_value_heads where they differ from the config's}."""
    written = raw.get("per_layer_config")
    if written is None:  # the released configs' spelling, as transformers reads it
        override: dict[str, Any] = {"head_dim": raw.get("global_head_dim") or DEFAULT_GLOBAL_HEAD_DIM}
        if k_eq_v and raw.get("num_global_key_value_heads") is not None:
            override["num_key_value_heads"] = raw["num_global_key_value_heads"]
        return {i: override for i, kind in enumerate(types) if kind == FULL}
    if not isinstance(written, dict):
        raise ModelError("The Gemma 4 config.json's per_layer_config is not an object.")
    result = {}
    for key, fields in written.items():
        if not isinstance(fields, dict) or not set(fields) <= {"head_dim", "num_key_value_heads"}:
            raise ModelError(f"The Gemma 4 config.json's per_layer_config overrides {key!r} with fields kvchat "
                             "does not run (it knows head_dim and num_key_value_heads).")
        if str(key).isdigit():
            result[int(key)] = fields
        elif key in (FULL, SLIDING):
            result.update({i: fields for i, kind in enumerate(types) if kind == key})
        else:
            raise ModelError(f"The Gemma 4 config.json's per_layer_config names no layer: {key!r}.")
    return result
