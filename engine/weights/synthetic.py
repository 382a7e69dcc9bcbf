"""Synthetic models: the exact shapes of well-known checkpoints, with seeded random weights.

The model spec `synthetic:NAME` (like a directory or a .gguf file) measures
speed on the shape of a real model without downloading anything;
`synthetic:NAME@QUANT` is the same shape as a quantized GGUF file of random
blocks (synthetic_gguf.py), for the quantized CPU kernels.
resolve_model turns it into a cached model directory holding config.json, a
tokenizer over the whole vocabulary (token i is the word "t<i>", so any id
decodes) and synthetic.json (name, seed), but no weights file: load_model sees
synthetic.json and draws the weights from SyntheticWeights, so everything after
that (fusing, validation, the engine) is the path a real model takes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from engine.config.model import ModelConfig
from engine.errors import ModelError
from engine.paths import cache_dir
from engine.weights.synthetic_weights import SyntheticWeights

PREFIX = "synthetic:"
MARKER = "synthetic.json"  # its presence makes load_model draw the weights instead of reading them
FORMAT_VERSION = 1  # part of the cache key: bump when the directory's contents change
GGUF_FORMAT_VERSION = 1  # part of a synthetic GGUF file's name: bump when what synthetic_gguf.py writes changes

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5}
_LLAMA3 = {**_LLAMA, "vocab_size": 128256, "max_position_embeddings": 131072, "head_dim": 64,
           "num_key_value_heads": 8, "rope_theta": 500000.0, "bos_token_id": 128000,
           "eos_token_id": [128001, 128008, 128009]}
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
          "attention_bias": False, "rms_norm_eps": 1e-6, "vocab_size": 151936, "head_dim": 128,
          "max_position_embeddings": 40960, "rope_theta": 1000000.0, "num_key_value_heads": 8,
          "use_sliding_window": False, "sliding_window": None, "bos_token_id": 151643, "eos_token_id": 151645}


_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6,
          "head_dim": 128, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "use_sliding_window": False,
          "sliding_window": None, "bos_token_id": 151643, "eos_token_id": 151645}
_GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "vocab_size": 262144, "head_dim": 256,
           "max_position_embeddings": 32768, "sliding_window": 512, "query_pre_attn_scalar": 256,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "tie_word_embeddings": True,
           "bos_token_id": 2, "eos_token_id": [1, 106]}


_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "mlp_only_layers")
_QWEN3_30B_A3B = {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "intermediate_size": 6144, "tie_word_embeddings": False, "num_experts": 128,
                  "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []}


_GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
                "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "sliding_window": 128,
                "attention_bias": True, "tie_word_embeddings": False, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
                "bos_token_id": 199998, "eos_token_id": 200002}


# Qwen3.5-0.8B's text model as its published card gives it (hidden 1,024, 24 layers: three Gated DeltaNet
# for each gated attention one, 8 query / 2 KV heads of 256, FFN 3,584, vocabulary 248,320, RoPE base 1e7 on a
# quarter of each head); its linear-attention heads (16 key and 16 value heads of 128) are the family's
# small-model choice, assumed: the card does not state them.
_QWEN35_08B = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 1024,
               "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
               "intermediate_size": 3584, "vocab_size": 248320, "rms_norm_eps": 1e-6,
               "max_position_embeddings": 262144, "tie_word_embeddings": True, "hidden_act": "silu",
               "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
               "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
               "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
               "bos_token_id": None, "eos_token_id": 248046}


def _llama3_rope(factor: float) -> dict:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


# name -> (the checkpoint whose config.json this copies, that config's fields)
MODELS: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", {
        **_LLAMA, "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
        "rope_theta": 100000.0, "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2}),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B-Instruct", {
        **_LLAMA3, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "intermediate_size": 8192, "tie_word_embeddings": True, "rope_scaling": _llama3_rope(32.0)}),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", {
        **_LLAMA3, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128,
        "intermediate_size": 14336, "tie_word_embeddings": False, "rope_scaling": _llama3_rope(8.0)}),
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B", {
        **_QWEN3, "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
        "intermediate_size": 3072, "tie_word_embeddings": True}),
    "gemma3-270m": ("google/gemma-3-270m-it", {
        **_GEMMA3, "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
        "intermediate_size": 2048}),
    "gemma3-1b": ("google/gemma-3-1b-it", {
        **_GEMMA3, "hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
        "intermediate_size": 6912}),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", {
        **_QWEN2, "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", {
        **_QWEN2, "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}),
    "qwen3-8b": ("Qwen/Qwen3-8B", {
        **_QWEN3, "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "intermediate_size": 12288, "tie_word_embeddings": False}),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", _QWEN3_30B_A3B),
    # Its twin with the same active parameters: the 8 routed experts' 768 rows as one dense MLP of 6,144,
    # what a mixture's decode is measured against (it reads the same bytes a token, without a router).
    "qwen3-30b-a3b-dense": ("Qwen/Qwen3-30B-A3B, its active parameters as a dense model", {
        key: value for key, value in _QWEN3_30B_A3B.items() if key not in _MOE_FIELDS} | {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}),
    # openai's 20B mixture (32 experts, 4 a token; sinks, 128-token windows every other layer): its file is
    # the experts in MXFP4 and the rest in Q8_0 (`@mxfp4`), as it is shipped.
    "gpt-oss-20b": ("openai/gpt-oss-20b", _GPT_OSS_20B),
    # A hybrid model: its recurrent layers' state checkpoints and its attention layers' K/V, at a real size.
    "qwen3.5-0.8b": ("Qwen/Qwen3.5-0.8B, its text model", _QWEN35_08B),
}
# A minimal template so `kvchat ask --model synthetic:...` runs; words outside "t<i>" all become token 0.
_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def synthetic_gguf(spec: str | None, progress: Callable[[str], None] = lambda _: None, seed: int = 0) -> Path | None:
    """The GGUF file of a `synthetic:NAME@QUANT` spec (e.g. synthetic:qwen2.5-1.5b@q4_k_m): NAME's shape with
    seeded random blocks in QUANT's mix (synthetic_gguf.py), written into the cache on first use; it then
    loads like any GGUF. None for any other spec. ModelError for an unknown name or quantization."""
    name = synthetic_name(spec)
    if name is None or "@" not in name:
        return None
    from engine.weights.synthetic_gguf import QUANTS, write_synthetic_gguf

    base, quant = name.split("@", 1)
    config = synthetic_config(base)
    if quant not in QUANTS:
        raise ModelError(f"Unknown synthetic quantization {quant!r}: use {', '.join(QUANTS)}.")
    path = cache_dir() / "models" / f"synthetic-{base}-{quant}-s{seed}-v{GGUF_FORMAT_VERSION}.gguf"
    if not path.is_file():  # written whole under another name and renamed: a file here is complete
        progress(f"writing the synthetic model {name} (first use only)")
        write_synthetic_gguf(path, config, quant, seed, _CHAT_TEMPLATE, progress)
    return path


def synthetic_name(spec: str | None) -> str | None:
    """NAME of a `synthetic:NAME` spec (unchecked), else None."""
    return spec[len(PREFIX):] if spec and spec.startswith(PREFIX) else None


def synthetic_config(name: str, layers: int | None = None) -> dict:
    """The config.json of a synthetic model; `layers` overrides the depth (for tests on big shapes)."""
    if name not in MODELS:
        raise ModelError(f"Unknown synthetic model {name!r}: kvchat has {', '.join(MODELS)}.")
    config = dict(MODELS[name][1])
    if layers is not None:
        if layers < 1:
            raise ModelError("A synthetic model needs at least one layer.")
        config["num_hidden_layers"] = layers
        if "layer_types" in config:  # a hybrid model's first `layers` layers, as the full model has them
            config["layer_types"] = config["layer_types"][:layers]
    return config


def synthetic_model_dir(name: str, layers: int | None = None, seed: int = 0) -> Path:
    """The cached directory of a synthetic model (written on first use, a few MB, no weights)."""
    config = synthetic_config(name, layers)
    depth = f"-{layers}l" if layers is not None else ""
    out_dir = cache_dir() / "models" / f"synthetic-{name}{depth}-s{seed}-v{FORMAT_VERSION}"
    if (out_dir / MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Written in a temporary directory and renamed, so a crash or a concurrent start never sees half of it.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is as readable as any other
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        _save_tokenizer(tmp, config)
        marker = {"name": name, "shape_of": MODELS[name][0], "layers": config["num_hidden_layers"], "seed": seed}
        (tmp / MARKER).write_text(json.dumps(marker), encoding="utf-8")
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not (out_dir / MARKER).is_file():  # not another process finishing first: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _save_tokenizer(path: Path, config: dict) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # decoding joins the words with spaces
    eos = config["eos_token_id"]
    eos = eos[-1] if isinstance(eos, list) else eos
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{eos}", unk_token="t0")
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def read_marker(model_dir: Path) -> dict | None:
    """synthetic.json of a model directory ({name, shape_of, layers, seed}), or None for a real model."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModelError(f"The synthetic model's {MARKER} cannot be read ({exc}).") from None


def synthetic_weights(model_dir: Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                      seed: int | None = None) -> SyntheticWeights:
    """The weight source of a synthetic model directory (its own seed unless `seed` is given)."""
    marker = read_marker(model_dir)
    if marker is None:
        raise ModelError(f"{model_dir} is not a synthetic model: it has no {MARKER}.")
    return SyntheticWeights(cfg, int(marker["seed"]) if seed is None else seed, device, dtype)
