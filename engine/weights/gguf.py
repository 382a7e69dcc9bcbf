"""Convert a GGUF file (llama, qwen2, qwen3, gemma3 architectures) into a Hugging Face model directory.

Tensors are dequantized to fp32, which holds every GGUF weight exactly, so one
conversion serves every engine dtype. llama.cpp stores Llama's q/k projections
with the rows of each head interleaved for its RoPE kernel; they are put back
in Hugging Face's rotate-half order here. The tokenizer and chat template are
rebuilt by transformers' GGUF tokenizer support. Every weight matrix in a type
the CPU kernels run (cpu/formats.py: Q4_0..Q8_0, Q2_K..Q6_K, F16, BF16) is
also kept unexpanded in blocks.safetensors; a matrix in any other type (IQ*,
TQ*...) runs dense, which one log line at conversion says.

Each file's sha256 is recorded at conversion (RECORD_FILE, hidden, so not
part of the model fingerprint), and `converted_damage` checks a directory
against it before it is used. Files are hashed only when their size or
mtime changed (weights/fingerprint.py's memo), so an untouched directory costs a few
stats; a change that keeps both (bit rot) is not seen here, but a file that
then fails to load is (model_source.reconvert). A directory converted by an
older kvchat, without a record, gets one on first use and is trusted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from engine.cpu.formats import BLOCK, FORMATS
from engine.errors import ModelError
from engine.weights import gguf_gemma3
from engine.weights.fingerprint import file_sha256, model_files_digest

log = logging.getLogger("kvchat")

COMPLETE_MARKER = "kvchat-conversion-complete"
RECORD_FILE = ".kvchat-sha256.json"  # {"sha256": {file name: hex}} of every file the conversion wrote
CONVERSION_VERSION = 4  # part of the cache key: bump when the directory's contents change
QUANT_WEIGHTS_FILE = "blocks.safetensors"  # the GGUF's weights the kernels run, unexpanded (cpu/formats.py)
# GGUF architectures whose q/k rows llama.cpp permuted at conversion time.
_PERMUTED_QK = {"llama"}
_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
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
}
_GEMMA3_LAYER_TENSORS = {**_LAYER_TENSORS, **gguf_gemma3.LAYER_TENSORS}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def open_gguf(path: Path):
    """A GGUFReader over `path`, or ModelError naming what is wrong with the file."""
    from gguf import GGUFReader

    class CheckedReader(GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            damage = _tensor_data_damage(fields, start_offs, len(self.data))
            if damage:
                raise ModelError(f"The GGUF file {path.name} is damaged: {damage}.")
            super()._build_tensors(start_offs, fields)

    try:
        return CheckedReader(str(path))
    except ModelError:
        raise
    except Exception as exc:  # the reader raises ValueError, struct errors, IndexError...
        raise ModelError(f"The GGUF file {path.name} is corrupt or not a GGUF model ({exc}).") from None


def _tensor_data_damage(fields: list, start: int, size: int) -> str | None:
    """What is wrong with the tensor table (truncated data, rows that are not whole blocks), or None.
    Read from the reader's own tensor fields; a layout this code does not know is left to the reader."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for field in fields:
        try:
            _, name_data, _, dims, raw_type, offset = field.parts
            name, qtype = bytes(name_data).decode("utf-8", "replace"), GGMLQuantizationType(int(raw_type[0]))
            block, type_size = GGML_QUANT_SIZES[qtype]
            dims = [int(d) for d in dims]
            end = start + int(offset[0]) + int(np.prod(dims)) // block * type_size
        except (ValueError, TypeError, KeyError, IndexError):
            return None
        if dims and dims[0] % block:
            return (f"its tensor {name} has rows of {dims[0]} weights, which {qtype.name}'s {block}-weight blocks "
                    "do not divide")
        if end > size:
            return f"its tensor {name} ends at byte {end:,}, but the file has {size:,} bytes (truncated?)"
    return None


def _field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_config(reader) -> dict[str, Any]:
    """The Hugging Face config.json a GGUF file's metadata describes."""
    arch = _field(reader, "general.architecture")
    if arch not in _MODEL_TYPE:
        raise ModelError(f"Unsupported GGUF architecture {arch!r}: kvchat converts llama, qwen2, qwen3 and gemma3.")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
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
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "gemma3": "Gemma3ForCausalLM"}[arch]],
        "model_type": _MODEL_TYPE[arch],
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
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
    if arch == "gemma3":
        config.update(gguf_gemma3.config_fields(lambda key, default: _field(reader, f"{arch}.{key}", default),
                                                need, config["num_hidden_layers"]))
        return config
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise ModelError(f"Unsupported RoPE scaling {scaling!r} in the GGUF file.")
    return config


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    # Inverse of llama.cpp's permute: per head, rows (pair, half) -> (half, pair).
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(reader, config: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, fp32 tensor) for every tensor of the GGUF file."""
    from gguf.quants import dequantize

    arch = _field(reader, "general.architecture")
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, arch)
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except Exception as exc:
            raise ModelError(f"The GGUF tensor {tensor.name} cannot be decoded ({exc}).") from None
        values = np.asarray(values, dtype=np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))
        if arch in _PERMUTED_QK and name.endswith("q_proj.weight"):
            values = _unpermute(values, config["num_attention_heads"])
        elif arch in _PERMUTED_QK and name.endswith("k_proj.weight"):
            values = _unpermute(values, config["num_key_value_heads"])
        if arch == "gemma3" and gguf_gemma3.is_shifted_norm(name):
            values = values - np.float32(1.0)  # a new array: llama.cpp stored 1 + w
        if not values.flags.writeable:  # unquantized tensors come back as views of the mmap
            values = values.copy()
        yield name, torch.from_numpy(np.ascontiguousarray(values))


def _block_arrays(tensor) -> tuple[str, dict[str, np.ndarray]] | None:
    """(format, {qs[, d, m]}) of a matrix in a type the kernels run, in their layout (cpu/formats.py),
    else None. Q4_1/Q8_0 are split into quants and fp32 scales; every other type is kept as stored."""
    fmt = tensor.tensor_type.name.lower()
    raw = np.asarray(tensor.data)
    if fmt not in FORMATS or raw.ndim != 2 or int(tensor.shape[0]) % BLOCK:
        return None
    rows = raw.shape[0]
    if fmt == "q4_1":  # per block: fp16 d, fp16 m, 16 bytes of nibbles
        blocks = raw.reshape(rows, -1, 20)
        return "q4_1", {
            "qs": blocks[:, :, 4:].reshape(rows, -1).copy(),
            "d": blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32),
            "m": blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32),
        }
    if fmt == "q8_0":
        blocks = raw.reshape(rows, -1, 34)  # per block: fp16 d, 32 int8
        return "q8_0", {
            "qs": blocks[:, :, 2:].copy().view(np.int8).reshape(rows, -1),
            "d": blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32),
        }
    if fmt == "bf16":  # stored as bytes; numpy has no bfloat16 (gguf_blocks views the int16 as one)
        return "bf16", {"qs": raw.copy().view(np.int16)}
    return fmt, {"qs": raw.copy()}


def _lookup_only(name: str, config: dict[str, Any]) -> bool:
    # An untied model's embedding is only looked up (dense); its lm_head is output.weight.
    return name == "model.embed_tokens.weight" and not config["tie_word_embeddings"]


def gguf_blocks(reader, config: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """("<hf name>.<format>.<qs|d|m>", tensor) for every matrix the kernels can run; logs, once, the
    types of the matrices they cannot (those run dense)."""
    arch = _field(reader, "general.architecture")
    dense: dict[str, int] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, arch)
        if _lookup_only(name, config):
            continue
        found = _block_arrays(tensor)
        if found is None:
            if len(tensor.shape) == 2 and tensor.tensor_type.name != "F32":
                dense[tensor.tensor_type.name] = dense.get(tensor.tensor_type.name, 0) + 1
            continue
        fmt, arrays = found
        for part, values in arrays.items():
            if arch in _PERMUTED_QK and name.endswith("q_proj.weight"):
                values = _unpermute(values, config["num_attention_heads"])
            elif arch in _PERMUTED_QK and name.endswith("k_proj.weight"):
                values = _unpermute(values, config["num_key_value_heads"])
            values = torch.from_numpy(np.ascontiguousarray(values))
            yield f"{name}.{fmt}.{part}", values.view(torch.bfloat16) if fmt == "bf16" else values
    if dense:
        types = ", ".join(f"{count} in {qtype}" for qtype, count in sorted(dense.items()))
        log.warning("kvchat: the CPU kernels do not run these GGUF weight matrices (%s); they run as dense fp32",
                    types)


def _hf_name(gguf_name: str, arch: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    layer_tensors = _GEMMA3_LAYER_TENSORS if arch == "gemma3" else _LAYER_TENSORS
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_tensors:
        return f"model.layers.{parts[1]}.{layer_tensors[parts[2]]}"
    raise ModelError(f"The GGUF file has a tensor kvchat does not know: {gguf_name}.")


def _export_tokenizer(gguf_path: Path, out_dir: Path, config: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:
        raise ModelError(f"The tokenizer in {gguf_path.name} cannot be read ({exc}).") from None
    # The GGUF metadata names the special tokens; transformers versions disagree on how they
    # carry them over (5.17 makes the BOS token the EOS token too), so set them from it.
    for role in ("bos", "eos"):
        token_id = config.get(f"{role}_token_id")
        if isinstance(token_id, int) and 0 <= token_id < len(tokenizer):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.save_pretrained(str(out_dir))


def _write_model_dir(gguf_path: Path, reader, config: dict[str, Any], out_dir: Path,
                     progress: Callable[[str], None]) -> None:
    if out_dir.exists():  # a directory without the marker is not ours to trust
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        progress("dequantizing weights")
        save_file(dict(gguf_tensors(reader, config)), str(staging / "model.safetensors"), metadata={"format": "pt"})
        blocks = dict(gguf_blocks(reader, config))
        if blocks:
            save_file(blocks, str(staging / QUANT_WEIGHTS_FILE), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
        progress("converting the tokenizer")
        _export_tokenizer(gguf_path, staging, config)
        (staging / COMPLETE_MARKER).write_text(gguf_path.name, encoding="utf-8")
        progress("recording the converted files' hashes")
        digests = _write_record(staging, {p.name: file_sha256(p) for p in _recorded_files(staging)})
        try:
            os.rename(staging, out_dir)
        except OSError:
            if not (out_dir / COMPLETE_MARKER).exists():
                raise
            return  # another process finished the same conversion first; its result is identical
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    model_files_digest(out_dir, trusted=digests)  # the fingerprint and the next check need not hash again


def _recorded_files(model_dir: Path) -> list[Path]:
    # The files model_files_digest hashes: regular, top level, not hidden.
    return sorted(p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith("."))


def _write_record(model_dir: Path, digests: dict[str, str]) -> dict[str, str]:
    tmp = model_dir / f"{RECORD_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"sha256": digests}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, model_dir / RECORD_FILE)
    return digests


def converted_damage(model_dir: Path) -> str | None:
    """What is wrong with a complete converted directory (a short phrase), or None if every file is the
    one the conversion wrote. Without a record (an older kvchat's conversion) one is written now."""
    try:
        current = model_files_digest(model_dir)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    try:
        recorded = json.loads((model_dir / RECORD_FILE).read_text(encoding="utf-8"))["sha256"]
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError
    except FileNotFoundError:
        try:
            _write_record(model_dir, current)  # trust on first use
        except OSError:
            pass  # a read-only cache: verified from the next writable start on
        return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return f"its record {RECORD_FILE} is unreadable"
    for name, digest in sorted(recorded.items()):
        if name not in current:
            return f"{name} is missing"
        if current[name] != digest:
            return f"the sha256 of {name} is not the one recorded at conversion"
    extra = sorted(set(current) - set(recorded))
    if extra:
        return f"it holds {extra[0]}, which the conversion did not write"
    return None


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Callable[[str], None] = lambda _: None) -> Path:
    """Write a model directory for `gguf_path` at `out_dir` (atomically) and return it.

    A directory left complete by an earlier or concurrent conversion is kept.
    """
    if (out_dir / COMPLETE_MARKER).exists():
        return out_dir
    reader = open_gguf(gguf_path)
    config = gguf_config(reader)
    try:
        _write_model_dir(gguf_path, reader, config, out_dir, progress)
    except OSError as exc:  # read-only cache, disk full...
        raise ModelError(f"The converted model cannot be written to {out_dir.parent} ({exc.strerror or exc}); "
                         "free some space or set KVCHAT_CACHE_DIR to a writable directory.") from None
    return out_dir
