"""Load a model's weights into CausalLM, from a GGUF file, a Hugging Face safetensors checkpoint or a synthetic source.

Tensors are read through a small name -> tensor interface (WeightSource): a
GGUF file mapped in place (gguf.py) is one source, safetensors files
another, a synthetic model's seeded generator (synthetic_weights.py) a third,
and all fusing and validation below is shared. q/k/v and gate/up are fused
into one matmul each. With block kernels, every linear layer whose parts are
all stored in a kernel format (cpu/formats.py) becomes a QuantLinear, and its
dense copy is never made: a GGUF's blocks where the file is mapped, a
bf16/f16 checkpoint's own 2-byte weights (the kernels widen them exactly, so
the model is the fp32 one). Fused parts in different formats (a Q4_K_M file's
q/k in Q4_K, v in Q6_K), or read in place (which concatenating would copy),
become a MixedQuantLinear of one QuantLinear per part or run of parts. An
embedding in a kernel format stays in it (cpu/embedding.py).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from itertools import groupby
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open
from torch import nn

from engine.cpu.embedding import QuantEmbedding
from engine.cpu.formats import BLOCK, FORMATS
from engine.cpu.kernels import QuantKernels
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
from engine.config.model import ModelConfig
from engine.model.partial_rotary import PartialRotaryRows
from engine.errors import ModelError
from engine.gguf.reader import GGUFWeights, gguf_config, log_dense_matrices, open_gguf
from engine.model.causal_lm import CausalLM
from engine.model.gemma4 import checkpoint_linears as gemma4_linears, checkpoint_tensors as gemma4_tensors
from engine.model import lfm2
from engine.model.qwen35 import Qwen35Rows, checkpoint_linears as qwen35_linears, checkpoint_tensors as qwen35_tensors
from engine.weights.stacked_experts import GEMMA4, GPT_OSS, QWEN35_MOE, StackedExperts
from engine.weights.skeleton import shapes_only
from engine.weights.synthetic import read_marker, synthetic_weights


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The dense safetensors files of a model directory (sharded or not)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"The model's safetensors index cannot be read ({exc}).") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"The model directory {model_dir} has no .safetensors weights.")
    return files


class WeightSource(Protocol):
    """Tensors by Hugging Face checkpoint name (e.g. "model.layers.0.self_attn.q_proj.weight")."""

    def __contains__(self, name: str) -> bool: ...

    def get(self, name: str) -> torch.Tensor:
        """The tensor (any device and dtype: the loader moves it); ModelError if there is none."""

    def block_format(self, name: str) -> str | None:
        """The kernel format (cpu/formats.py) `name` is stored in, as "<name>.<format>.<part>" tensors,
        else None."""


# A multimodal checkpoint (Gemma 3 4B+) keeps its text model under a prefix; the vision tower's tensors
# are never asked for. Stored prefix -> the text model's name for it.
_TEXT_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                        "language_model.lm_head.": "lm_head."}


def _text_model_name(stored: str) -> str:
    for prefix, ours in _TEXT_MODEL_PREFIXES.items():
        if stored.startswith(prefix):
            return ours + stored[len(prefix):]
    return stored


class _Checkpoint:
    """Name -> tensor over one or more open safetensors files (a multimodal checkpoint's text model
    under the text model's own names)."""

    def __init__(self, files: list[Path], stack: ExitStack):
        self._where: dict[str, object] = {}
        self._stored: dict[str, str] = {}  # our name -> the file's, where they differ
        for path in files:
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as exc:  # safetensors raises its own error types
                raise ModelError(f"The weights file {path.name} is corrupt or unreadable ({exc}).") from None
            for stored in handle.keys():
                name = _text_model_name(stored)
                self._where[name] = handle
                if name != stored:
                    self._stored[name] = stored

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise ModelError(f"The model's weights have no tensor named {name!r}.")
        try:
            return handle.get_tensor(self._stored.get(name, name))
        except Exception as exc:
            raise ModelError(f"The weights tensor {name!r} cannot be read ({exc}).") from None

    def block_format(self, name: str) -> str | None:
        return next((fmt for fmt in FORMATS if f"{name}.{fmt}.qs" in self._where), None)

    def dtype_and_shape(self, name: str) -> tuple[str, list[int]] | None:
        """The stored dtype ("BF16", "F32"...) and shape of `name`, without reading it; None if absent."""
        handle = self._where.get(name)
        if handle is None:
            return None
        tensor = handle.get_slice(self._stored.get(name, name))
        return tensor.get_dtype(), tensor.get_shape()


class _HalfPrecisionLinears:
    """A dense checkpoint's bf16/f16 weight matrices as blocks of the "bf16"/"f16" kernel formats: the
    tensor itself is the format's "qs" (2 bytes a weight, widened exactly in the kernel)."""

    _FORMATS = {"BF16": "bf16", "F16": "f16"}

    def __init__(self, ckpt: _Checkpoint | StackedExperts):
        self._ckpt = ckpt

    def __contains__(self, name: str) -> bool:
        return self._stored_as(name) is not None

    def get(self, name: str) -> torch.Tensor:
        base = self._stored_as(name)
        if base is None:
            raise ModelError(f"The model's weights have no tensor named {name!r}.")
        return self._ckpt.get(base)

    def _stored_as(self, name: str) -> str | None:
        """The dense tensor "<base>.<format>.qs" stands for, if `base` is stored in that format."""
        base, fmt, part = name.rsplit(".", 2) if name.count(".") >= 2 else (name, "", "")
        return base if part == "qs" and self.block_format(base) == fmt else None

    def block_format(self, name: str) -> str | None:
        stored = self._ckpt.dtype_and_shape(name)
        if stored is None or len(stored[1]) != 2 or stored[1][1] % BLOCK:
            return None
        return self._FORMATS.get(stored[0])


def _linears(cfg: ModelConfig, ckpt: WeightSource) -> list[tuple[str, list[str], list[str] | None]]:
    """(module path, checkpoint weight names, bias names or None) of every linear layer."""
    head = "model.embed_tokens" if cfg.tie_word_embeddings else "lm_head"
    if cfg.gemma4 is not None:  # its layers vary in what they hold: model/gemma4.py
        return [*gemma4_linears(cfg), ("lm_head", [head], None)]
    if cfg.family == "lfm2":  # short-convolution and attention layers: model/lfm2.py
        return [*lfm2.checkpoint_linears(cfg), ("lm_head", [head], None)]
    if cfg.family == "qwen35":  # its token mixers differ by layer: model/qwen35.py
        mlps = [spec for i in range(cfg.num_layers)
                for spec in (_moe_linears(cfg, ckpt, i) if cfg.is_moe(i) else
                             _mlp_linears(ckpt, f"layers.{i}.mlp.", f"model.layers.{i}.mlp.", cfg.mlp_bias))]
        return [*qwen35_linears(cfg), *mlps, ("lm_head", [head], None)]
    specs = []
    for i in range(cfg.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        # Phi-3 stores q/k/v fused, in kvchat's order (q heads, k heads, v heads): read as it is.
        fused = f"{attn}qkv_proj.weight" in ckpt
        qkv = [attn + "qkv_proj"] if fused else [f"{attn}{p}_proj" for p in "qkv"]
        specs += [
            (f"layers.{i}.self_attn.qkv_proj", qkv, qkv if cfg.qkv_bias else None),
            (f"layers.{i}.self_attn.o_proj", [attn + "o_proj"], [attn + "o_proj"] if cfg.o_bias else None),
        ]
        if cfg.is_moe(i):
            specs += _moe_linears(cfg, ckpt, i)
            continue
        specs += _mlp_linears(ckpt, f"layers.{i}.mlp.", mlp, cfg.mlp_bias)
    specs.append(("lm_head", [head], None))
    return specs


def _moe_linears(cfg: ModelConfig, ckpt: WeightSource, i: int) -> list[tuple[str, list[str], list[str] | None]]:
    """Layer i's mixture (model/moe.py): the router, each expert's gated MLP, then the shared expert and its gate
    where it has one (Qwen3.5-MoE)."""
    ours, mlp, biased = f"layers.{i}.mlp.", f"model.layers.{i}.mlp.", cfg.moe.biased
    specs = [(ours + "gate", [mlp + "gate"], [mlp + "gate"] if biased else None)]
    for e in range(cfg.moe.experts):
        specs += _mlp_linears(ckpt, f"{ours}experts.{e}.", f"{mlp}experts.{e}.", biased)
    if cfg.moe.shared_intermediate_size:
        specs += _mlp_linears(ckpt, ours + "shared_expert.", mlp + "shared_expert.", biased)
        specs.append((ours + "shared_expert_gate", [mlp + "shared_expert_gate"], None))
    return specs


def _mlp_linears(ckpt: WeightSource, module: str, stored: str,
                 biased: bool) -> list[tuple[str, list[str], list[str] | None]]:
    """A gated MLP's two linears: gate and up fused, then down (module path, checkpoint prefix). Phi-3 stores
    gate and up fused already, gate's rows first as kvchat's are: read as it is."""
    fused = f"{stored}gate_up_proj.weight" in ckpt
    gate_up = [stored + "gate_up_proj"] if fused else [stored + "gate_proj", stored + "up_proj"]
    down = [stored + "down_proj"]
    return [(module + "gate_up_proj", gate_up, gate_up if biased else None),
            (module + "down_proj", down, down if biased else None)]


def _quant_linear(kernels: QuantKernels, blocks: WeightSource, names: list[str],
                  bias: torch.Tensor | None) -> nn.Module | None:
    """The linear of `names` (fused in that order) in its stored formats, or None if a part has none."""
    formats = [blocks.block_format(f"{n}.weight") for n in names]
    if None in formats:
        return None  # a part is dense only: the whole layer stays dense
    in_place = getattr(blocks, "IN_PLACE", False)
    parts, first = [], 0
    runs = groupby(enumerate(zip(names, formats)), key=lambda item: item[0] if in_place else item[1][1])
    for _, run in runs:
        run = [named for _, named in run]
        fmt = run[0][1]
        qs = _joined(blocks, [f"{n}.weight" for n, _ in run], f".{fmt}.qs")
        rows = qs.shape[0]
        part_bias = None if bias is None else bias[first : first + rows]
        # Read once into the tiles (if the format has them): the mapped pages need not stay resident, and go
        # as they are read.
        part = QuantLinear(kernels, fmt, qs, part_bias, read=blocks.release if in_place else None)
        parts.append(part)
        first += rows
    return parts[0] if len(parts) == 1 else MixedQuantLinear(parts)


def _quant_embedding(kernels: QuantKernels | None, blocks: WeightSource | None,
                     tied_head: nn.Module | None) -> QuantEmbedding | None:
    """The embedding in its stored format (a tied lm_head's QuantLinear shared), or None: dense."""
    name = "model.embed_tokens.weight"
    fmt = blocks.block_format(name) if blocks is not None and kernels is not None else None
    if fmt is None:
        return None
    if isinstance(tied_head, QuantLinear):
        return QuantEmbedding(tied_head)
    # Only looked up, never multiplied: no integer tiles (they would be a second copy of the table).
    return QuantEmbedding(QuantLinear(kernels.with_integer_products(False), fmt, blocks.get(f"{name}.{fmt}.qs")))


def _joined(ckpt: WeightSource, names: list[str], suffix: str) -> torch.Tensor:
    """The tensors of `names` stacked along dim 0 (one name: that tensor, not a copy of it)."""
    parts = [ckpt.get(name + suffix) for name in names]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def load_model(path: Path, device: torch.device, dtype: torch.dtype,
               kernels: QuantKernels | None = None) -> CausalLM:
    """Build CausalLM from a .gguf file (load_gguf), or from a directory's config.json and safetensors
    (a synthetic model's directory: from its seeded generator, on `device` in `dtype`)."""
    if path.is_file():
        return load_gguf(path, device, dtype, kernels)
    cfg = ModelConfig.from_file(path / "config.json")
    if read_marker(path) is not None:
        return load_from(cfg, synthetic_weights(path, cfg, device, dtype), device, dtype)
    with ExitStack() as stack:
        ckpt = _Checkpoint(checkpoint_files(path), stack)
        if cfg.model_type == "gpt_oss" or (cfg.gemma4 is not None and cfg.moe is not None):
            ckpt = StackedExperts(ckpt, GEMMA4 if cfg.gemma4 is not None else GPT_OSS)
        elif cfg.family == "qwen35" and cfg.moe is not None and "model.layers.0.mlp.experts.gate_up_proj" in ckpt:
            ckpt = StackedExperts(ckpt, QWEN35_MOE)  # as transformers holds them; save_pretrained writes each apart
        blocks = _HalfPrecisionLinears(ckpt) if kernels is not None else None
        return load_from(cfg, ckpt, device, dtype, kernels, blocks)


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype, kernels: QuantKernels | None = None) -> CausalLM:
    """CausalLM of a GGUF file, its config from the file's metadata. With `kernels`, every matrix they read
    stays in the file's mapping (gguf.py); without (dense, CUDA, a non-fp32 dtype), every tensor is
    dequantized in memory to `dtype`, one at a time. Nothing is written to disk."""
    reader = open_gguf(path)
    config = gguf_config(reader)
    weights = GGUFWeights(reader, config, blocks=kernels is not None)
    if kernels is not None:
        log_dense_matrices(weights)
    return load_from(ModelConfig.from_dict(config), weights, device, dtype, kernels,
                     weights if kernels is not None else None)


CPU_ALIGNMENT = 64  # bytes: torch's CPU allocator's alignment


def load_from(cfg: ModelConfig, ckpt: WeightSource, device: torch.device, dtype: torch.dtype,
              kernels: QuantKernels | None = None, blocks: WeightSource | None = None) -> CausalLM:
    """Build CausalLM for `cfg` and fill it from `ckpt` (and quantized linears from `blocks`, with `kernels`)."""
    if cfg.family == "qwen35":  # q_proj's query and gate rows apart (model/qwen35.py), before any reorder of q
        ckpt = Qwen35Rows(ckpt, cfg)
        blocks = Qwen35Rows(blocks, cfg) if blocks is not None else None
    if cfg.rope.rotary_dim(cfg.head_dim) < cfg.head_dim:  # q/k reordered for partial rotary: model/partial_rotary.py
        ckpt = PartialRotaryRows(ckpt, cfg)
        blocks = PartialRotaryRows(blocks, cfg) if blocks is not None else None
    with shapes_only():
        model = CausalLM(cfg)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}

    def put(name: str, tensor: torch.Tensor) -> None:
        if tensor.shape != expected[name].shape:
            raise ModelError(f"The weights tensor for {name} has shape {tuple(tensor.shape)}, "
                             f"but config.json implies {tuple(expected[name].shape)}.")
        placed = tensor.to(device=device, dtype=dtype)
        if placed.device.type == "cpu" and placed.data_ptr() % CPU_ALIGNMENT:
            # A view into a mapped safetensors file lies where the file's header puts it (8-byte aligned).
            # The BLAS's sums may follow the address (MKL's sgemv does on an AMD EPYC: one row's logits differ
            # in the last bit between the same weights at two offsets), so every weight gets its own aligned
            # memory, as a fresh allocation has: the same weights then give the same bits, whatever the file.
            placed = placed.clone()
        state[name] = placed

    put("norm.weight", ckpt.get(lfm2.FINAL_NORM if cfg.family == "lfm2" else "model.norm.weight"))
    for i in range(cfg.num_layers):
        for norm in model.layers[i].NORMS:
            put(f"layers.{i}.{norm}.weight", ckpt.get(f"model.layers.{i}.{norm}.weight"))
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                put(f"layers.{i}.self_attn.{norm}.weight", ckpt.get(f"model.layers.{i}.self_attn.{norm}.weight"))
        if cfg.attention_sinks:
            put(f"layers.{i}.self_attn.sinks", ckpt.get(f"model.layers.{i}.self_attn.sinks"))
    for ours, stored in gemma4_tensors(cfg) if cfg.gemma4 is not None else ():
        put(ours, ckpt.get(stored))
    for ours, stored in lfm2.checkpoint_tensors(cfg) if cfg.family == "lfm2" else ():
        put(ours, ckpt.get(stored))
    for ours, stored in qwen35_tensors(cfg) if cfg.family == "qwen35" else ():
        put(ours, ckpt.get(stored))
    for module, names, bias_names in _linears(cfg, ckpt):
        bias = _joined(ckpt, bias_names, ".bias") if bias_names else None
        packed = _quant_linear(kernels, blocks, names, bias) if blocks is not None and kernels is not None else None
        if packed is not None:
            model.set_submodule(module, packed)
            continue
        if module == "lm_head" and cfg.tie_word_embeddings:
            continue  # tied below to the dense embedding
        put(f"{module}.weight", _joined(ckpt, names, ".weight"))
        if bias is not None:
            put(f"{module}.bias", bias)
    embedding = _quant_embedding(kernels, blocks, model.lm_head if cfg.tie_word_embeddings else None)
    if embedding is not None:
        if (embedding.num_embeddings, embedding.embedding_dim) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelError(f"The embedding has shape {(embedding.num_embeddings, embedding.embedding_dim)}, "
                             f"but config.json implies {(cfg.vocab_size, cfg.hidden_size)}.")
        model.embed_tokens = embedding
    else:
        put("embed_tokens.weight", ckpt.get("model.embed_tokens.weight"))
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings and not isinstance(model.lm_head, QuantLinear):
        model.lm_head.weight = model.embed_tokens.weight
    left_empty = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left_empty:
        raise ModelError(f"The model's weights do not fill {left_empty[0]}.")
    model.eval().requires_grad_(False)
    state.clear()  # else each expert's own tensor would outlive prepare's stacking of them (model/moe.py)
    model.prepare()
    return model
