"""A synthetic model's shape as a quantized GGUF file: seeded random blocks in a real file's type mix.

`synthetic:NAME@QUANT` (synthetic.py resolves it) is written once into the cache
and then loads like any downloaded GGUF, so the quantized CPU kernels, the
conversion and the load time are measured at a real model's size.

The blocks are random but valid: every quant byte is random (each bit pattern is
a valid quant), and every fp16 scale is finite and drawn around the value that
gives weights of standard deviation STD, as synthetic_weights.py's fp32 weights
(random bytes as scales would hold NaN, inf and 1e4-sized weights). Norms are
ones, biases N(0, STD) in F32. Each tensor's bytes come from a generator seeded
by (seed, tensor name): the same seed always writes the same file.

Q4_K_M, as llama.cpp's quantizer mixes it (llama_tensor_get_type): Q4_K for
every matrix except attn_v and ffn_down of the layers `use_more_bits` picks
(the first and last eighth, every third between: about half), which are Q6_K;
output.weight Q6_K, or the token embedding when it is also the output (tied),
else the embedding is Q4_K. A matrix whose rows are not whole 256-weight
super-blocks falls back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0). The
single-type quants (q4_0, q8_0, q4_k, q6_k) give every matrix that type. `mxfp4` is gpt-oss's file as openai
ships it: the experts in MXFP4 (an E8M0 exponent byte a block, drawn around the one that gives STD), every
other matrix Q8_0.

The tokenizer is GPT-2-style byte-level BPE: the model's special ids as
<|bos|>/<|eos|> control tokens, the 256 byte tokens and two merges (transformers
needs a merge list) in the first ids left, every other id "t<i>" (so any id
decodes), and synthetic.py's minimal chat template.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.errors import ModelError
from engine.config.model import ModelConfig
from engine.weights.synthetic_weights import STD, tensor_seed, tensor_shapes

QUANTS = ("q4_k_m", "q4_k", "q6_k", "q8_0", "q4_0", "mxfp4", "iq4_xs")
# Where each type's fp16 scales sit in a block (d; d, dmin for Q4_K), and the d that gives weights of
# standard deviation STD with random quants (measured with gguf's dequantizer: 4.76, 9.70, 76.8, 269 and
# 1443 times d; IQ4_NL 67.4 and IQ4_XS, whose random 6-bit sub-scales multiply it, 1245). Q4_K's dmin is 7.5 d, so
# a sub-block's offset cancels its quants' mean on average.
_HALF_FIELDS = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
                "IQ4_XS": (0,)}
_UNIT_D = {"Q4_0": 4.76, "Q5_0": 9.70, "Q8_0": 76.8, "Q4_K": 269.0, "Q6_K": 1443.0, "IQ4_NL": 67.4, "IQ4_XS": 1245.0}
_DMIN_PER_D = 7.5
# MXFP4's doubled e2m1 values have an RMS of 5.85 over uniform nibbles, and its scale is 2^(e - 128): weights of
# standard deviation STD = 0.02 want e near 128 + log2(0.02 / 5.85) = 119.8.
_MXFP4_EXPONENTS = (119, 120, 121)
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}  # rows not whole super-blocks, as llama.cpp
_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "llama": "llama", "gpt_oss": "gpt-oss"}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",  # a mixture's router: F32, as llama.cpp keeps it
}
# gpt-oss's names where they differ (its post-attention norm, o bias, sinks, router bias).
_GPT_OSS_NAMES = {**_LAYER_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
                  "self_attn.o_proj.bias": "attn_output.bias", "self_attn.sinks": "attn_sinks.weight",
                  "mlp.gate.bias": "ffn_gate_inp.bias"}
# A mixture's experts: one 3-D tensor [experts, rows, K] a projection, as llama.cpp stores them (gpt-oss's
# biases: [experts, rows]).
_EXPERT_NAMES = {"gate_proj.weight": "ffn_gate_exps.weight", "up_proj.weight": "ffn_up_exps.weight",
                 "down_proj.weight": "ffn_down_exps.weight", "gate_proj.bias": "ffn_gate_exps.bias",
                 "up_proj.bias": "ffn_up_exps.bias", "down_proj.bias": "ffn_down_exps.bias"}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def gguf_tensor_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    if rest.startswith("mlp.experts."):  # mlp.experts.<e>.<projection>: the layer's stacked tensor
        return f"blk.{layer}.{_EXPERT_NAMES[rest.split('.', 3)[3]]}"
    return f"blk.{layer}.{(_GPT_OSS_NAMES if arch == 'gpt-oss' else _LAYER_NAMES)[rest]}"


def gguf_shapes(cfg: ModelConfig, arch: str = "llama") -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape (rows first); a mixture's experts stacked: (experts, rows, K), biases
    (experts, rows)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in tensor_shapes(cfg).items():
        gguf_name = gguf_tensor_name(name, arch)
        if "_exps." in gguf_name:
            shape = (cfg.moe.experts, *shape)
        shapes[gguf_name] = shape
    return shapes


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(quant: str, name: str, shape: tuple[int, ...], layers: int, tied: bool) -> str | None:
    """The GGML type `quant` gives a GGUF tensor (None: F32, for norms, biases and a mixture's router)."""
    if len(shape) not in (2, 3) or name.endswith(("ffn_gate_inp.weight", ".bias")):
        return None
    if quant == "mxfp4":  # gpt-oss as shipped: experts MXFP4, every other matrix Q8_0
        qtype = "MXFP4" if name.endswith("_exps.weight") else "Q8_0"
    elif quant == "iq4_xs" and (name == "output.weight" or (tied and name == "token_embd.weight")):
        qtype = "Q6_K"  # llama.cpp keeps the output in Q6_K in an IQ4_XS file too
    elif quant == "q4_k_m":
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            qtype = "Q6_K"
        elif name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")) and use_more_bits(int(name.split(".")[1]), layers):
            qtype = "Q6_K"
        else:
            qtype = "Q4_K"
    else:
        qtype = quant.upper()
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if shape[-1] % GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]:
        qtype = _FALLBACK.get(qtype, qtype)
    if shape[-1] % GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]:
        raise ModelError(f"A synthetic {quant} model needs rows of whole blocks; {name} has {shape[-1]} weights a row.")
    return qtype


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes a row] uint8: random quants, finite fp16 scales of realistic size (weights' std about STD)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    count = rows * (cols // block)
    # The generator's raw 64-bit words viewed as bytes: twice as fast as rng.bytes, and already writable.
    words = rng.bit_generator.random_raw(-(-count * size // 8))
    raw = words.view(np.uint8)[:count * size].reshape(count, size)
    if qtype == "MXFP4":  # its scale is one exponent byte
        raw[:, 0] = rng.choice(np.array(_MXFP4_EXPONENTS, dtype=np.uint8), count)
        return raw.reshape(rows, -1)
    d = (STD / _UNIT_D[qtype]) * rng.uniform(0.5, 1.5, count)  # varied like a real file's scales, never 0
    halves = [d] + ([d * _DMIN_PER_D] if len(_HALF_FIELDS[qtype]) > 1 else [])
    for offset, values in zip(_HALF_FIELDS[qtype], halves):
        raw[:, offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(count, 2)
    return raw.reshape(rows, -1)


def _tensor_bytes(name: str, shape: tuple[int, ...], qtype: str | None, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(tensor_seed(seed, name)))
    if qtype is not None:  # a stack of experts' matrices: their rows one after another
        return random_blocks(qtype, int(np.prod(shape[:-1])), shape[-1], rng).reshape(*shape[:-1], -1)
    if name.endswith("norm.weight"):
        return np.ones(shape, dtype=np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(STD))  # a bias


def _special_ids(config: dict) -> tuple[int, list[int]]:
    eos = config["eos_token_id"]
    return int(config["bos_token_id"]), [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _tokens(config: dict) -> tuple[list[str], list[int]]:
    """The vocabulary (the specials at their ids, the byte tokens and two merge results in the first ids
    left, "t<i>" for the rest) and the token types."""
    from tokenizers import pre_tokenizers

    vocab, (bos, eos) = config["vocab_size"], _special_ids(config)
    specials = {bos: "<|bos|>", **{token_id: f"<|eos{i or ''}|>" for i, token_id in enumerate(eos)}}
    byte_level = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "Ġa"]
    if vocab < len(byte_level) + len(specials) or not all(0 <= i < vocab for i in specials):
        raise ModelError(f"A synthetic GGUF needs a vocabulary of at least {len(byte_level) + len(specials)} "
                         "tokens that holds its special ids.")
    tokens = [specials.get(i, f"t{i}") for i in range(vocab)]
    free = (i for i in range(vocab) if i not in specials)
    for token, token_id in zip(byte_level, free):
        tokens[token_id] = token
    types = [3 if i in specials else 1 for i in range(vocab)]  # 3: control
    return tokens, types


def _add_metadata(writer, config: dict, arch: str, quant: str, chat_template: str) -> None:
    writer.add_name(f"synthetic {quant}")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta") or config["rope_parameters"]["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    tokens, types = _tokens(config)
    bos, eos = _special_ids(config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t", "Ġ a"])  # two: transformers reads a one-element list as a scalar
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos[-1])
    writer.add_chat_template(chat_template)
    if arch == "qwen3moe":
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gpt-oss":  # what llama.cpp's converter writes for it
        from gguf import RopeScalingType

        rope = config["rope_parameters"]
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["intermediate_size"])
        writer.add_sliding_window(config["sliding_window"])
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def write_synthetic_gguf(path: Path, config: dict, quant: str, seed: int, chat_template: str,
                         progress: Callable[[str], None] = lambda _: None) -> Path:
    """Write the GGUF file of `config` (a config.json dict) in `quant` at `path`, atomically; returns path.
    ModelError for a quant or a shape this cannot write."""
    import gguf

    if quant not in QUANTS:
        raise ModelError(f"Unknown synthetic quantization {quant!r}: use {', '.join(QUANTS)}.")
    arch = _ARCH.get(config.get("model_type"))
    if arch is None or config.get("rope_scaling"):
        raise ModelError("Synthetic GGUF files are written for Qwen2, Qwen3, Qwen3-MoE, gpt-oss and Llama shapes "
                         "without RoPE scaling (a GGUF stores Llama 3's as frequency factors kvchat does not load).")
    if (quant == "mxfp4") != (arch == "gpt-oss"):
        raise ModelError("A synthetic mxfp4 file is gpt-oss's mix, and gpt-oss is written only as mxfp4.")
    cfg = ModelConfig.from_dict(config)
    shapes = gguf_shapes(cfg, arch)
    tied, layers = cfg.tie_word_embeddings, cfg.num_layers
    types = {name: tensor_type(quant, name, shape, layers, tied) for name, shape in shapes.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(str(tmp), arch)
        _add_metadata(writer, config, arch, quant, chat_template)
        for name, shape in shapes.items():
            qtype = types[name]
            if qtype is None:
                writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            else:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
                byte_shape = (*shape[:-1], shape[-1] // block * size)
                writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                       raw_dtype=gguf.GGMLQuantizationType[qtype])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (name, shape) in enumerate(shapes.items()):
            if i % 32 == 0:
                progress(f"writing random blocks ({i}/{len(shapes)} tensors)")
            writer.write_tensor_data(_tensor_bytes(name, shape, types[name], seed))
        writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is as readable as any other
        os.replace(tmp, path)  # a crash or a concurrent start never sees half a file
    except OSError as exc:
        raise ModelError(f"The synthetic model cannot be written to {path.parent} ({exc.strerror or exc}); free "
                         "some space or set KVCHAT_CACHE_DIR to a writable directory.") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path

