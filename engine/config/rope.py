"""RopeConfig: a model's rotary embedding as its config.json describes it (type, base, scaling), read in the
one place every family's config goes through; model/rope.py turns it into frequencies and tables."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import ModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
GEMMA4_ROPE_TYPES = ("default", "proportional")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    type: str = "default"
    factor: float = 1.0
    # llama3 scaling only
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn scaling only (gpt-oss, Ministral 3): the ramp between interpolated and extrapolated
    # frequencies, and the factor cos/sin are multiplied by (None: derived from `factor`).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None  # also longrope's (None: derived from `factor`)
    # Phi-3 / Phi-4-mini: the fraction of each head's dims that is rotated (the rest pass through:
    # model/partial_rotary.py), and longrope's per-pair frequency divisors for short and long contexts,
    # of which the engine runs one (long_context), chosen once for its context window (config/phi3.py).
    partial_rotary_factor: float = 1.0
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    long_context: bool = False
    # Gemma 4's "proportional" RoPE: the first `proportion` of each half's pairs turn at theta ** (-2i / head_dim),
    # the others at frequency 0 (cos 1, sin 0: passed through), all in the whole head's rotate-half layout.
    proportion: float = 1.0

    def rotary_dim(self, head_dim: int) -> int:
        """How many of a head's dims are rotated (the first ones, in Hugging Face's layout)."""
        return int(head_dim * self.partial_rotary_factor)


def check_partial_rotary(head_dim: int, partial: float) -> None:
    """Refuse a partial_rotary_factor that does not rotate an even number (pairs) of a head's dims."""
    rotary = int(head_dim * partial)
    if not 2 <= rotary <= head_dim or rotary % 2:
        raise ModelError(f"The model rotates {rotary} of its {head_dim} head dimensions (partial_rotary_factor "
                         f"{partial}), which is not an even number of them that kvchat can run.")


def gemma4_rope(params: dict[str, Any]) -> RopeConfig:
    rope_type = params.get("rope_type") or "default"
    if rope_type not in GEMMA4_ROPE_TYPES:
        raise ModelError(f"Unsupported Gemma 4 RoPE {rope_type!r}: kvchat runs {', '.join(GEMMA4_ROPE_TYPES)}.")
    proportion = float(params.get("partial_rotary_factor", 1.0))
    if rope_type == "default" and proportion != 1.0:
        raise ModelError("A Gemma 4 default RoPE with a partial_rotary_factor is not one kvchat runs.")
    return RopeConfig(theta=float(params.get("rope_theta", 10000.0)), type=rope_type,
                      factor=float(params.get("factor", 1.0)), proportion=proportion)


def rope_config(raw: dict[str, Any]) -> RopeConfig:
    # transformers 5 writes "rope_parameters"; older configs write rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    return rope_from({**scaling, **params}, raw)


def rope_from(params: dict[str, Any], raw: dict[str, Any]) -> RopeConfig:
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelError(
            f"Unsupported RoPE scaling {rope_type!r}: kvchat supports {', '.join(SUPPORTED_ROPE_TYPES)}."
        )
    # transformers moves a top-level partial_rotary_factor into the RoPE parameters.
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelError("Partial rotary embeddings are supported by kvchat on Phi-3 models only.")
    return RopeConfig(
        theta=theta,
        type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))
        ),
        **(_yarn_fields(params) if rope_type == "yarn" else {}),
    )


def _yarn_fields(params: dict[str, Any]) -> dict[str, Any]:
    factor = params.get("attention_factor")
    if factor is None and params.get("mscale") and params.get("mscale_all_dim"):
        # transformers' ratio of two mscales (Ministral 3 sets both to 1: cos/sin are not scaled at all);
        # with either unset it derives the factor from `factor` alone (rope.magnitude).
        scale = float(params.get("factor", 1.0))

        def mscale(m: float) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        factor = float(mscale(params["mscale"]) / mscale(params["mscale_all_dim"]))
    return {"beta_fast": float(params.get("beta_fast") or 32.0), "beta_slow": float(params.get("beta_slow") or 1.0),
            "truncate": bool(params.get("truncate", True)),
            "attention_factor": float(factor) if factor is not None else None}
