"""Read a GGUF file (llama, qwen2, qwen3, qwen3moe, gpt-oss, smollm3, phi3, mistral3, gemma3, gemma4, lfm2, qwen35, qwen35moe architectures) as a Hugging Face model: its config, and
its tensors under Hugging Face names (GGUFWeights, the loader's WeightSource: weights/checkpoint.py).

The file is memory-mapped copy-on-write (file.py) and nothing is written to disk. A matrix in a
format the CPU kernels read (cpu/formats.py) is handed over as a tensor that VIEWS its bytes in the
mapping: the pages are the page cache's, shared with every other process mapping the file, and read
from disk only when first touched. The one exception is Llama's q/k projections: llama.cpp stored their
rows interleaved per head for its RoPE kernel, and putting whole rows of blocks back in Hugging Face's
rotate-half order (`unpermute`) copies those two matrices per layer into RAM (their quantized size:
about 2 * hidden * hidden * bytes-per-weight per layer). Everything else (norms, biases, F32 vectors,
Gemma's shifted norms, and every tensor of a dense load) is dequantized to a new fp32 tensor, which the
loader casts to the model's dtype.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.cpu.formats import BLOCK, FORMATS
from engine.errors import ModelError
from engine.gguf import gemma3 as gguf_gemma3, gemma4 as gguf_gemma4, gpt_oss as gguf_gpt_oss, mistral3 as gguf_mistral3, phi3 as gguf_phi3
from engine.gguf import lfm2 as gguf_lfm2
from engine.gguf import qwen35 as gguf_qwen35
from engine.gguf.file import GGUFFile, GGUFFormatError, GGUFTensor, TensorTableDamage

log = logging.getLogger("kvchat")

# GGUF architectures whose q/k rows llama.cpp permuted at conversion time.
_PERMUTED_QK = {"llama", "smollm3", "mistral3"}
# GGUF general.architecture -> the Hugging Face model_type it is read as (also what `kvchat models` runs).
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text",
               "smollm3": "smollm3", "gpt-oss": "gpt_oss", "phi3": "phi3", "mistral3": "ministral3",
               "gemma4": "gemma4_text", "lfm2": "lfm2",
               "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}
_HF_ARCHITECTURE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                    "qwen3moe": "Qwen3MoeForCausalLM", "gemma3": "Gemma3ForCausalLM",
                    "smollm3": "SmolLM3ForCausalLM", "gpt-oss": "GptOssForCausalLM", "phi3": "Phi3ForCausalLM",
                    "mistral3": "Ministral3ForCausalLM", "gemma4": "Gemma4ForCausalLM", "lfm2": "Lfm2ForCausalLM",
                    "qwen35": "Qwen3_5ForCausalLM", "qwen35moe": "Qwen3_5MoeForCausalLM"}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",  # a mixture of experts' router
}
# A mixture's experts, stacked in one 3-D tensor each ([experts, rows, K]): one Hugging Face matrix an expert.
_EXPERT_TENSORS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                   "ffn_down_exps.weight": "down_proj"}
# GGUF architecture -> its layer tensors' names, where they are not _LAYER_TENSORS.
_ARCH_LAYER_TENSORS = {"gemma3": {**_LAYER_TENSORS, **gguf_gemma3.LAYER_TENSORS},
                       "gemma4": {**_LAYER_TENSORS, **gguf_gemma4.LAYER_TENSORS},
                       "gpt-oss": {**_LAYER_TENSORS, **gguf_gpt_oss.LAYER_TENSORS},
                       "phi3": {**_LAYER_TENSORS, **gguf_phi3.LAYER_TENSORS},
                       "lfm2": {**_LAYER_TENSORS, **gguf_lfm2.LAYER_TENSORS},
                       "qwen35": {**_LAYER_TENSORS, **gguf_qwen35.LAYER_TENSORS},
                       "qwen35moe": {**_LAYER_TENSORS, **gguf_qwen35.MOE_LAYER_TENSORS}}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def open_gguf(path: Path) -> GGUFFile:
    """The GGUF file at `path`, mapped (file.py), or ModelError naming what is wrong with it."""
    try:
        return GGUFFile(path)
    except TensorTableDamage as exc:
        raise ModelError(f"The GGUF file {path.name} is damaged: {exc}.") from None
    except (GGUFFormatError, OSError, ValueError) as exc:  # ValueError: numpy cannot map an empty file
        raise ModelError(f"The GGUF file {path.name} is corrupt or not a GGUF model ({exc}).") from None


def architecture(reader) -> str:
    return _field(reader, "general.architecture")


def _field(reader, key: str, default: Any = None) -> Any:
    value = reader.fields.get(key)
    return default if value is None else value


def _first(value: Any) -> Any:
    """A metadata number, or the first layer's of a per-layer list (gemma4.py reads the whole list)."""
    return value[0] if isinstance(value, list) and value else value


def gguf_config(reader) -> dict[str, Any]:
    """The Hugging Face config.json a GGUF file's metadata describes."""
    arch = _field(reader, "general.architecture")
    if arch not in MODEL_TYPES:
        raise ModelError(f"Unsupported GGUF architecture {arch!r}: kvchat reads {', '.join(sorted(MODEL_TYPES))}.")
    if arch != "gemma4" and any(t.name == "rope_freqs.weight" for t in reader.tensors):  # gemma4's: gemma4.py
        raise ModelError("This GGUF stores Llama 3.1 RoPE frequency factors; use the Hugging Face model directory instead.")

    def need(key: str) -> Any:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelError(f"The GGUF file lacks the metadata field {arch}.{key}.")
        return value

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    names = {t.name for t in reader.tensors}
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "architectures": [_HF_ARCHITECTURE[arch]],
        "model_type": MODEL_TYPES[arch],
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_first(_field(reader, f"{arch}.feed_forward_length")) or 0) or int(
            need({"qwen3moe": "expert_feed_forward_length", "qwen35moe": "expert_shared_feed_forward_length"}.get(
                arch, "feed_forward_length"))),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_first(_field(reader, f"{arch}.attention.head_count_kv", heads))),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    if arch == "qwen3moe":
        config.update(_moe_fields(reader, arch, need, names, config["num_hidden_layers"]))
    if arch == "smollm3":  # llama.cpp fixes its NoPE layers in code (every fourth), with no metadata key
        config["no_rope_layer_interval"] = 4
    if arch == "gpt-oss":
        config.update(gguf_gpt_oss.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                 need, config["num_hidden_layers"]))
        return config
    if arch == "gemma3":
        config.update(gguf_gemma3.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                need, config["num_hidden_layers"]))
        return config
    if arch == "gemma4":  # a layout that varies layer by layer (gguf/gemma4.py)
        config.update(gguf_gemma4.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                need, config["num_hidden_layers"], reader.tensors))
        return config
    if arch in gguf_qwen35.ARCHITECTURES:  # its hybrid layout and partial rotary; MoE's experts (gguf/qwen35.py)
        config.update(gguf_qwen35.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                need, config["num_hidden_layers"], config["head_dim"],
                                                moe=arch == gguf_qwen35.MOE_ARCHITECTURE))
        return config
    if arch == "phi3":  # its RoPE (partial rotary, LongRoPE) and sliding window: phi3.py
        config.update(gguf_phi3.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                              need, reader.tensors, config["head_dim"]))
    if arch == "lfm2":  # its layer kinds from the per-layer KV heads, the convolutions' taps (gguf/lfm2.py)
        config.update(gguf_lfm2.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                              need, config["num_hidden_layers"]))
    if arch == "mistral3":  # YaRN and the attention temperature (gguf/mistral3.py)
        config.update(gguf_mistral3.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                  need))
        return config
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ModelError(f"Unsupported RoPE scaling {scaling!r} in the GGUF file.")
    return config


def _moe_fields(reader, arch: str, need, names: set[str], num_layers: int) -> dict[str, Any]:
    """A mixture of experts' config fields. llama.cpp always renormalises Qwen3-MoE's chosen experts'
    weights (as its config's norm_topk_prob says); a layer without a router is a dense one."""
    return {
        "num_experts": int(need("expert_count")),
        "num_experts_per_tok": int(need("expert_used_count")),
        "moe_intermediate_size": int(need("expert_feed_forward_length")),
        "norm_topk_prob": bool(_field(reader, f"{arch}.expert_weights_norm", True)),
        "mlp_only_layers": [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in names],
    }


def _expert_slices(tensor) -> list[GGUFTensor]:
    """A stacked experts tensor as one tensor an expert (a matrix, or a bias vector), each viewing its part
    of the mapping."""
    return [GGUFTensor(f"{tensor.name}[{e}]", tensor.shape[:-1], tensor.tensor_type, tensor.data[e])
            for e in range(tensor.data.shape[0])]


def _halves(tensor) -> tuple[GGUFTensor, GGUFTensor]:
    """A fused gate/up tensor (gate's rows first) as its two halves, views of the mapping."""
    rows = tensor.data.shape[0] // 2
    shape = (*tensor.shape[:-1], rows)
    return (GGUFTensor(f"{tensor.name}.gate", shape, tensor.tensor_type, tensor.data[:rows]),
            GGUFTensor(f"{tensor.name}.up", shape, tensor.tensor_type, tensor.data[rows:]))


def _hf_tensors(reader, arch: str) -> dict[str, Any]:
    """The file's tensors by Hugging Face name; a stacked experts tensor as one matrix (or bias) an expert."""
    tensors = {}
    experts = gguf_gemma4.EXPERTS if arch == "gemma4" else "mlp.experts."  # under a layer's Hugging Face names
    for tensor in reader.tensors:
        parts = tensor.name.split(".", 2)
        kind = parts[2] if len(parts) == 3 and parts[0] == "blk" else None
        stacked = _EXPERT_TENSORS.get(kind) or gguf_gpt_oss.EXPERT_BIASES.get(kind)
        if stacked is not None or kind in gguf_gpt_oss.FUSED_GATE_UP:
            suffix = "weight" if kind.endswith(".weight") else "bias"
            if len(tensor.shape) != (3 if suffix == "weight" else 2):
                raise ModelError(f"The GGUF tensor {tensor.name} is not one {'matrix' if suffix == 'weight' else 'vector'} "
                                 "an expert.")
            prefix = f"model.layers.{parts[1]}.{experts}"
            for e, expert in enumerate(_expert_slices(tensor)):
                if stacked is not None:
                    tensors[f"{prefix}{e}.{stacked}.{suffix}"] = expert
                else:
                    tensors[f"{prefix}{e}.gate_proj.{suffix}"], tensors[f"{prefix}{e}.up_proj.{suffix}"] = _halves(expert)
        elif not ((arch == "phi3" and tensor.name in gguf_phi3.ROPE_FACTORS)  # those are config (gguf_config)
                  or (arch == "gemma4" and tensor.name == gguf_gemma4.ROPE_FREQS)):
            tensors[hf_name(tensor.name, arch)] = tensor
    return tensors


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute: per head, rows (pair, half) -> (half, pair). Whole rows move, so
    `weight` may be values [rows, K] or a row's raw blocks [rows, bytes]; the result is a new array."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def permuted_heads(name: str, arch: str, config: dict[str, Any]) -> int | None:
    """The head count llama.cpp permuted the rows of Hugging Face tensor `name` by, or None."""
    if arch not in _PERMUTED_QK:
        return None
    if name.endswith("q_proj.weight"):
        return config["num_attention_heads"]
    if name.endswith("k_proj.weight"):
        return config["num_key_value_heads"]
    return None


def dense_tensor(tensor, name: str, arch: str, config: dict[str, Any]) -> torch.Tensor:
    """The fp32 values of GGUF tensor `tensor` (Hugging Face name `name`), a copy in Hugging Face layout."""
    from gguf.quants import dequantize

    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:
        raise ModelError(f"The GGUF tensor {tensor.name} cannot be decoded ({exc}).") from None
    values = np.asarray(values, dtype=np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))
    heads = permuted_heads(name, arch, config)
    if heads is not None:
        values = unpermute(values, heads)
    if arch == "gemma3" and gguf_gemma3.is_shifted_norm(name):
        values = values - np.float32(1.0)  # a new array: llama.cpp stored 1 + w
    if arch == "lfm2" and gguf_lfm2.is_conv_taps(name):
        values = values.reshape(values.shape[0], 1, -1)  # the dim llama.cpp squeezed out
    if arch in gguf_qwen35.ARCHITECTURES:  # shifted norms, -exp(A_log), value heads reordered (gguf/qwen35.py)
        values = gguf_qwen35.hf_values(values, name, config)
    if np.may_share_memory(values, tensor.data):  # an F32 tensor comes back as a view of the mapping
        values = values.copy()
    return torch.from_numpy(np.ascontiguousarray(values))


def hf_name(gguf_name: str, arch: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    if arch == "gemma4" and gguf_name in gguf_gemma4.GLOBAL_TENSORS:
        return gguf_gemma4.GLOBAL_TENSORS[gguf_name]
    if arch == "lfm2" and gguf_name in gguf_lfm2.GLOBAL_TENSORS:
        return gguf_lfm2.GLOBAL_TENSORS[gguf_name]
    layer_tensors = _ARCH_LAYER_TENSORS.get(arch, _LAYER_TENSORS)
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_tensors:
        return f"model.layers.{parts[1]}.{layer_tensors[parts[2]]}"
    raise ModelError(f"The GGUF file has a tensor kvchat does not know: {gguf_name}.")


class GGUFWeights:
    """Tensors by Hugging Face name over an open GGUF reader; with `blocks`, the matrices the kernels
    read also as "<name>.<format>.qs" (block_format says which)."""

    IN_PLACE = True  # its block tensors view the file: fusing two of them (torch.cat) would copy them

    def __init__(self, reader, config: dict[str, Any], blocks: bool):
        self._reader = reader
        self._config = config
        self._arch = architecture(reader)
        self._tensors = _hf_tensors(reader, self._arch)
        self._blocks = blocks

    def names(self) -> list[str]:
        """The Hugging Face names of the file's tensors (dense ones; block names are derived from them)."""
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors or self._block_base(name) is not None

    def get(self, name: str) -> torch.Tensor:
        base = self._block_base(name)
        if base is not None:
            return self._raw_blocks(base)
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelError(f"The GGUF file has no tensor for {name!r}.")
        return dense_tensor(tensor, name, self._arch, self._config)

    def block_format(self, name: str) -> str | None:
        if not self._blocks:
            return None
        tensor = self._tensors.get(name)
        if tensor is None or len(tensor.shape) != 2 or int(tensor.shape[0]) % BLOCK:
            return None
        if self._arch in gguf_qwen35.ARCHITECTURES and not gguf_qwen35.blocks_in_place(name, self._config):
            return None
        fmt = tensor.tensor_type.name.lower()
        return fmt if fmt in FORMATS else None

    def dense_matrix_types(self) -> dict[str, int]:
        """{GGUF type: count} of the weight matrices the kernels cannot read (they run dense)."""
        types: dict[str, int] = {}
        for name, tensor in self._tensors.items():
            if len(tensor.shape) == 2 and tensor.tensor_type.name != "F32" and self.block_format(name) is None:
                types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
        return types

    def release(self, blocks: torch.Tensor) -> None:
        """`blocks` (from get) has been copied into the kernels' own layout: the file's pages under it
        may leave resident memory (GGUFFile.release; a RAM copy such as unpermuted q/k is left alone)."""
        release = getattr(self._reader, "release", None)
        if release is not None:
            release(blocks.data_ptr(), blocks.numel() * blocks.element_size())

    def _block_base(self, name: str) -> str | None:
        """The tensor "<base>.<format>.qs" stands for, if `base` is stored in that format."""
        if name.count(".") < 2:
            return None
        base, fmt, part = name.rsplit(".", 2)
        return base if part == "qs" and self.block_format(base) == fmt else None

    def _raw_blocks(self, name: str) -> torch.Tensor:
        tensor = self._tensors[name]
        raw = tensor.data  # a view of the mapping: [rows, bytes a row] (F16: float16 [rows, K])
        heads = permuted_heads(name, self._arch, self._config)
        if heads is not None:
            raw = unpermute(raw, heads)  # a copy in RAM: whole rows of blocks back in rotate-half order
        if self._arch in gguf_qwen35.ARCHITECTURES:  # value heads' rows back in grouped order (a copy), if it has them
            raw = gguf_qwen35.hf_rows(raw, name, self._config)
        if tensor.tensor_type.name == "BF16":  # bytes in the file; numpy has no bfloat16
            return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(raw)


def log_dense_matrices(weights: GGUFWeights) -> None:
    types = weights.dense_matrix_types()
    if types:
        listed = ", ".join(f"{count} in {qtype}" for qtype, count in sorted(types.items()))
        log.warning("kvchat: the CPU kernels do not run these GGUF weight matrices (%s); they run as dense fp32",
                    listed)
