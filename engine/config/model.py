"""ModelConfig: the few numbers of a Hugging Face config.json the decoder needs.

Read straight from the JSON (not through transformers) so that the engine does
not depend on how a transformers version names RoPE fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.config import gemma3
from engine.config import gemma4
from engine.config import gpt_oss
from engine.config.gemma4 import Gemma4Layers
from engine.config.hybrid import HybridLayers
from engine.config import lfm2
from engine.config import phi3
from engine.config import qwen35
from engine.config import ministral3
from engine.config.rope import RopeConfig, gemma4_rope, rope_config, rope_from

# model_type -> the per-architecture switches that are not spelled out in config.json.
SUPPORTED_ARCHITECTURES = {
    "llama": {"qkv_bias": None, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": None, "qk_norm": True},
    "gemma3_text": {"qkv_bias": None, "qk_norm": True},
    "gemma4_text": {"qkv_bias": False, "qk_norm": False},  # its q/k/v norms are its layer's (model/gemma4.py)
    "qwen3_moe": {"qkv_bias": None, "qk_norm": True},
    "smollm3": {"qkv_bias": None, "qk_norm": False},
    "gpt_oss": {"qkv_bias": None, "qk_norm": False},
    "phi3": {"qkv_bias": False, "qk_norm": False},
    "ministral3": {"qkv_bias": False, "qk_norm": False},
    "lfm2": {"qkv_bias": False, "qk_norm": False},  # its attention layers' q/k norms are model/lfm2.py's
    "qwen3_5_text": {"qkv_bias": False, "qk_norm": False},  # its gated attention has its own q/k norms
    "qwen3_5_moe_text": {"qkv_bias": False, "qk_norm": False},
}
# A multimodal config whose text model kvchat runs (its text_config).
MULTIMODAL_WRAPPERS = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "mistral3": "ministral3",
                       "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
_TEXT_CONFIGS = {"gemma3": gemma3.text_config, "gemma4": gemma4.text_config, "mistral3": ministral3.text_config,
                 "qwen3_5": qwen35.text_config, "qwen3_5_moe": qwen35.text_config}


@dataclass(frozen=True)
class AttentionTemperature:
    """Llama 4's attention temperature (Ministral 3): after RoPE, q at position p is multiplied by
    1 + beta * ln(1 + floor(p / length)), exactly 1 below `length` (model/temperature.py)."""

    beta: float
    length: int


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts MLP: `experts` gated MLPs of `intermediate_size`, of which a router picks
    `per_token` for each token, weighted by their softmax probabilities (renormalised over the chosen
    ones when `normalize`); `layers[i]` says whether layer i has it (else a dense MLP; Gemma 4 has both).
    `shared_intermediate_size` (Qwen3.5-MoE; 0: none) is the size of a gated MLP every token goes through
    beside the chosen experts, its output scaled by a learned sigmoid gate."""

    experts: int
    per_token: int
    intermediate_size: int
    normalize: bool
    layers: tuple[bool, ...]
    # gpt-oss: the router has a bias and picks the top-k logits before the softmax (over those k only);
    # its experts have biases and gate with a clamped SwiGLU (model/mlp.py).
    softmax_after_topk: bool = False
    biased: bool = False
    # Gemma 4: the router scores its input (the residual stream, RMS-normalised by its layer) times a learned
    # vector and 1/sqrt(hidden), and multiplies each chosen expert's renormalised weight by that expert's
    # learned scale; the weights stay fp32 until they have multiplied the experts' outputs.
    scaled_router: bool = False
    shared_intermediate_size: int = 0

    @classmethod
    def from_dict(cls, raw: dict[str, Any], num_layers: int) -> "MoEConfig":
        # transformers 5 writes num_local_experts; the models' own configs say num_experts.
        experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
        per_token = int(raw.get("num_experts_per_tok") or raw.get("top_k_experts") or 0)  # Gemma 4: top_k_experts
        if not 1 <= per_token <= experts:
            raise ModelError(f"The model routes each token to {per_token} of {experts} experts, which is not "
                             "a mixture kvchat can run.")
        step = int(raw.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in raw.get("mlp_only_layers") or ()}
        layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
        if raw.get("model_type") == "gpt_oss":  # every layer routes; the softmax is over the chosen logits
            return cls(experts=experts, per_token=per_token, intermediate_size=int(raw["intermediate_size"]),
                       normalize=False, layers=(True,) * num_layers, softmax_after_topk=True, biased=True)
        if raw.get("model_type") == "gemma4_text":  # every layer's experts sit beside its dense MLP (model/gemma4.py)
            return cls(experts=experts, per_token=per_token, intermediate_size=int(raw["moe_intermediate_size"]),
                       normalize=True, layers=(True,) * num_layers, scaled_router=True)
        if raw.get("model_type") == qwen35.MOE_MODEL_TYPE:  # every layer routes, always renormalised
            return cls(experts=experts, per_token=per_token, intermediate_size=int(raw["moe_intermediate_size"]),
                       normalize=True, layers=(True,) * num_layers,
                       shared_intermediate_size=int(raw["shared_expert_intermediate_size"]))
        return cls(experts=experts, per_token=per_token, intermediate_size=int(raw["moe_intermediate_size"]),
                   normalize=bool(raw.get("norm_topk_prob", False)), layers=layers)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())
    # Gemma 3: per-layer sliding windows (None: full attention; empty: every layer full), the RoPE of
    # the windowed layers, q.k scale, MLP activation, sqrt(hidden)-scaled embeddings, logit soft-cap.
    layer_windows: tuple[int | None, ...] = ()
    local_rope: RopeConfig | None = None
    attention_scale: float | None = None  # None: head_dim ** -0.5
    hidden_act: str = "silu"
    embed_scale: bool = False
    final_logit_softcapping: float | None = None
    # Mixture of experts (Qwen3-MoE, gpt-oss, Qwen3.5-MoE; Gemma 4's beside its MLP): per layer, whether it has the
    # routed experts (model/moe.py).
    moe: MoEConfig | None = None
    # SmolLM3: per layer, whether its q/k are rotated (its NoPE layers are not); empty: every layer's are.
    rope_layers: tuple[bool, ...] = ()
    # gpt-oss: a learned logit per query head that joins every softmax (attention "sinks"), and the
    # clamp of its experts' SwiGLU (hidden_act "swiglu_oai": model/mlp.py).
    attention_sinks: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    # Ministral 3: what q is multiplied by after RoPE, by position; None: by nothing.
    attention_temperature: AttentionTemperature | None = None
    # Gemma 4: what varies layer by layer (head size, KV heads, shared K/V, MLP width, per-layer inputs). There,
    # head_dim and num_kv_heads are the largest of its layers': the shape of the KV cache (model/gemma4.py).
    gemma4: Gemma4Layers | None = None
    # A hybrid model (Qwen3.5, LFM2): each layer's token mixer, attention or recurrent (config/hybrid.py).
    hybrid: HybridLayers | None = None

    @property
    def kv_layers(self) -> int:
        """Layers whose K/V the cache keeps: every layer, or a hybrid model's attention layers."""
        return self.hybrid.kv_layers if self.hybrid is not None else self.num_layers

    @property
    def family(self) -> str:
        """The decoder's layer structure: "gemma3" (four norms a layer, (1 + w) norm weights), "gemma4", "lfm2"
        (short-convolution and attention layers), "qwen35" (Gated DeltaNet and gated attention layers) or "llama"."""
        families = {"gemma3_text": "gemma3", "gemma4_text": "gemma4", "lfm2": "lfm2", "qwen3_5_text": "qwen35",
                    "qwen3_5_moe_text": "qwen35"}
        return families.get(self.model_type, "llama")

    def layer_head_dim(self, layer: int) -> int:
        """The head size of `layer`'s q/k/v (Gemma 4's full layers have their own; else head_dim)."""
        return self.gemma4.head_dims[layer] if self.gemma4 is not None else self.head_dim

    def uses_rope(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    def is_moe(self, layer: int) -> bool:
        return self.moe is not None and self.moe.layers[layer]

    def window(self, layer: int) -> int | None:
        """Keys a query of `layer` sees at most (itself included), or None: all earlier ones."""
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_for(self, layer: int) -> RopeConfig:
        return self.local_rope if self.local_rope is not None and self.window(layer) else self.rope

    @property
    def q_scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim ** -0.5

    @property
    def context_window(self) -> int:
        """Longest sequence (prompt + reply, tokens) this engine will run.

        A model whose every layer slides (Mistral) is capped at its window: inside it, sliding and
        full attention are the same computation, so the engine stays exact. Gemma 3's mixed layers
        apply their window as a mask (layer_windows) and run the whole context.
        """
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        _refuse_quantized(raw)
        if raw.get("model_type") in MULTIMODAL_WRAPPERS:
            raw = _TEXT_CONFIGS[raw["model_type"]](raw)
            _refuse_quantized(raw)
        model_type = raw.get("model_type")
        if model_type in lfm2.REFUSED:
            raise ModelError(lfm2.REFUSED[model_type])
        if model_type in qwen35.MODEL_TYPES:
            raw = qwen35.with_defaults(raw)
        if model_type not in SUPPORTED_ARCHITECTURES:
            names = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            raise ModelError(f"Unsupported model architecture {model_type!r}: kvchat runs {names}.")
        arch = SUPPORTED_ARCHITECTURES[model_type]
        if model_type == "gemma3_text" and (why := gemma3.unsupported(raw)):
            raise ModelError(f"This Gemma 3 model uses {why}, which kvchat does not run.")
        if model_type == "gemma4_text" and (why := gemma4.unsupported(raw)):
            raise ModelError(f"This Gemma 4 model uses {why}, which kvchat does not run.")
        try:
            if model_type == "lfm2":  # its keys and defaults as the Llama family's (config/lfm2.py)
                raw = lfm2.normalized(raw)
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            head_dim = int(raw.get("head_dim") or hidden // heads)
            if model_type == "phi3":
                rope = RopeConfig(**phi3.rope_fields(raw, head_dim))
            elif model_type in qwen35.MODEL_TYPES:  # partial rotary (config/qwen35.py)
                rope = qwen35.rope(raw, head_dim)
            else:
                rope = rope_config(raw)
            attention_bias = bool(raw.get("attention_bias", False))
            qkv_bias = arch["qkv_bias"] if arch["qkv_bias"] is not None else attention_bias
            fields = dict(
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rope=rope,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=qkv_bias,
                # Llama's attention_bias also covers o_proj; Qwen2 biases only q/k/v.
                o_bias=attention_bias and model_type == "llama",
                mlp_bias=bool(raw.get("mlp_bias", False)),
                qk_norm=arch["qk_norm"],
                sliding_window=_sliding_window(raw),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=_as_ids(raw.get("eos_token_id")),
            )
            if model_type == "gemma3_text":
                fields.update(_gemma3_fields(raw))
            if model_type == "gemma4_text":
                fields.update(_gemma4_fields(raw))
            if model_type == "qwen3_moe":
                fields["moe"] = MoEConfig.from_dict(raw, fields["num_layers"])
            if model_type == "smollm3":
                fields["rope_layers"] = _smollm3_rope_layers(raw, fields["num_layers"])
            if model_type == "gpt_oss":
                fields.update(gpt_oss.config_fields(raw, fields["num_layers"]),
                              moe=MoEConfig.from_dict(raw, fields["num_layers"]))
            if model_type == "ministral3":
                fields["attention_temperature"] = _ministral3_temperature(raw)
            if model_type == "phi3":
                fields.update(phi3.config_fields(raw))
            if model_type == "lfm2":
                fields["hybrid"] = lfm2.hybrid_layers(raw, fields["num_layers"])
            if model_type in qwen35.MODEL_TYPES:
                fields.update(qwen35.config_fields(raw, fields["num_layers"]))
            if model_type == qwen35.MOE_MODEL_TYPE:
                fields["moe"] = MoEConfig.from_dict(raw, fields["num_layers"])
            cfg = cls(**fields)
            if cfg.rope.type == "longrope":  # one factor list for the whole context window (config/phi3.py)
                long = phi3.uses_long_factors(cfg.context_window, cfg.rope.original_max_position_embeddings)
                cfg = replace(cfg, rope=replace(cfg.rope, long_context=long))
            return cfg
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"The model's config.json is incomplete or malformed ({exc!r}).") from None

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"The model directory has no config.json: {path.parent}.") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelError(f"The model's config.json cannot be read ({exc}).") from None
        if not isinstance(raw, dict):
            raise ModelError("The model's config.json is not a JSON object.")
        return cls.from_dict(raw)


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _refuse_quantized(raw: dict[str, Any]) -> None:
    # Quantized safetensors (Ministral 3's FP8 releases, GPTQ, AWQ...) hold integers and scales the loader
    # would read as plain weights.
    quantization = raw.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise ModelError(f"This model's weights are quantized ({method or 'quantization_config'}), which kvchat "
                         "does not run; use its unquantized (BF16) release or a GGUF file.")


def _ministral3_temperature(raw: dict[str, Any]) -> AttentionTemperature | None:
    """Ministral 3's attention temperature; None where beta is 0 (a factor of exactly 1 everywhere)."""
    beta, length = ministral3.temperature({**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})})
    return AttentionTemperature(beta, length) if beta else None


def _gemma3_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers = int(raw["num_hidden_layers"])
    window = int(raw.get("sliding_window") or 4096)
    ropes = gemma3.rope_parameters(raw)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu"):
        raise ModelError(f"Unsupported Gemma 3 activation {activation!r}.")
    cap = raw.get("final_logit_softcapping")
    return {
        # The window is a mask per layer, not a cap on the context (see context_window).
        "sliding_window": None,
        "layer_windows": tuple(window if kind == gemma3.SLIDING else None
                               for kind in gemma3.layer_types(raw, layers)),
        "rope": rope_from(ropes[gemma3.FULL], raw),
        "local_rope": rope_from(ropes[gemma3.SLIDING], raw),
        "attention_scale": float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        "hidden_act": "gelu_pytorch_tanh" if activation == "gelu_pytorch_tanh" else "gelu",
        "embed_scale": True,
        "final_logit_softcapping": float(cap) if cap is not None else None,
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
        "max_position_embeddings": int(raw.get("max_position_embeddings", 131072)),
    }


def _gemma4_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's fields (sliding/full layers, GELU-tanh, scaled embeddings, soft-capped logits), with Gemma 4's
    per-layer layout, unscaled q.k (its q/k norms take the scale's place), its RoPE per kind of layer and the
    experts beside every layer's MLP (enable_moe_block: the 26B-A4B)."""
    types = gemma4.layer_types(raw, int(raw["num_hidden_layers"]))
    layout = gemma4.layers(raw, types)
    window = int(raw.get("sliding_window") or 512)
    ropes = gemma4.rope_parameters(raw)
    cap = raw.get("final_logit_softcapping")
    return {
        "sliding_window": None,  # a mask per layer, as Gemma 3's
        "layer_windows": tuple(window if kind == gemma4.SLIDING else None for kind in types),
        "rope": gemma4_rope(ropes[gemma4.FULL]),
        "local_rope": gemma4_rope(ropes[gemma4.SLIDING]),
        "attention_scale": 1.0,
        "hidden_act": "gelu_pytorch_tanh",
        "embed_scale": True,
        "final_logit_softcapping": float(cap) if cap is not None else None,
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
        "max_position_embeddings": int(raw.get("max_position_embeddings", 131072)),
        "head_dim": max(layout.head_dims),
        "num_kv_heads": max(layout.kv_heads),
        "gemma4": layout,
        "moe": MoEConfig.from_dict(raw, len(types)) if raw.get("enable_moe_block") else None,
    }


def _smollm3_rope_layers(raw: dict[str, Any], layers: int) -> tuple[bool, ...]:
    """SmolLM3's no_rope_layers (1: the layer uses RoPE), else one NoPE layer every no_rope_layer_interval."""
    if raw.get("use_sliding_window"):
        raise ModelError("This SmolLM3 model uses sliding-window layers, which kvchat does not run.")
    listed = raw.get("no_rope_layers")
    if listed is None:
        interval = int(raw.get("no_rope_layer_interval") or 4)
        return tuple((i + 1) % interval != 0 for i in range(layers))
    if len(listed) != layers:
        raise ModelError(f"The model's no_rope_layers lists {len(listed)} layers, not its {layers}.")
    return tuple(bool(flag) for flag in listed)


def _sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    # Qwen2/Qwen3 configs carry a window that is off unless use_sliding_window is set.
    if raw.get("model_type") in ("qwen2", "qwen3", "qwen3_moe", "smollm3") and not raw.get("use_sliding_window", False):
        return None
    return int(window) if window else None
