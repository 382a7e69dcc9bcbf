"""A model on disk judged without loading it: its size, architecture and quant type, and whether kvchat runs
it or, in a few words, why not (for `kvchat models` and the settings screen's model picker).

A GGUF file is judged by its header and tensor table alone, read with struct (gguf/header.py, long
arrays such as the vocabulary stepped over): the tensors' data is never read, mapped into numpy or hashed, so
a 20 GB file costs what its first megabytes cost. A model directory is judged by its config.json.

What runs is the engine's own word, never a second list kept here: the GGUF architectures gguf/reader.py
converts, the model types config/model.py builds, the quant types the CPU's kernels read (cpu/formats.py)
plus F32 (dequantized exactly), and the refusals gguf_config and ModelConfig raise, called on the header's
fields. Those modules import torch, so they are imported when the first summary is asked for.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from engine.errors import ModelError
from engine.sources.app_stores import split_part
from engine.gguf.header import GGUFFormatError, HeaderCursor

_MOST_DIMS = 4  # GGML's tensors have at most 4 dimensions: more is a damaged table, not a tensor
_FLOAT_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # config.json's dtype, as GGUF says it


@dataclass(frozen=True)
class ModelSummary:
    size: int | None  # bytes on disk (a split model: its parts found; a directory: its files); None: unknown
    architecture: str | None  # GGUF general.architecture, or config.json's model_type
    quant: str | None  # GGUF: general.file_type's name, else its weights' commonest type; a directory: its dtype
    problem: str | None = None  # None: kvchat runs it; else why not, in a few words

    @property
    def runs(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class _Tensor:
    name: str
    dims: tuple[int, ...]
    kind: int  # GGML's type number
    offset: int  # from the start of the data


def summarize(path: Path, parts: Sequence[Path] = ()) -> ModelSummary:
    """The summary of a GGUF file or a model directory; `parts`: a split model's files found (app_stores.py)."""
    try:
        stat = path.stat()
    except OSError as exc:
        return ModelSummary(None, None, None, f"not readable ({exc.strerror or exc})")
    if path.is_dir():
        return _directory(path)
    return _gguf_once(path, tuple(parts), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=512)
def _gguf_once(path: Path, parts: tuple[Path, ...], size: int, mtime_ns: int, inode: int) -> ModelSummary:
    # Keyed by size, mtime and inode too: a file replaced in place is read again, and the picker, which asks
    # every time it opens, reads each unchanged file's header once (a 150K-token vocabulary is ~0.1 s to step over).
    return _gguf(path, parts, size)


def _gguf(path: Path, parts: tuple[Path, ...], size: int) -> ModelSummary:
    total = sum(_file_size(p) for p in parts) if parts else size
    try:
        fields, tensors, data_start = _read_header(path)
    except GGUFFormatError as exc:
        return ModelSummary(total, None, None, f"not a readable GGUF file ({exc})")
    except ValueError:  # mmap refuses an empty file
        return ModelSummary(total, None, None, "not a readable GGUF file (it is empty)")
    except OSError as exc:
        return ModelSummary(total, None, None, f"not readable ({exc.strerror or exc})")
    architecture = fields.get("general.architecture")
    architecture = architecture if isinstance(architecture, str) else None
    types = Counter(_type_name(t.kind) for t in tensors if len(t.dims) >= 2)  # matrices and expert stacks
    quant = _file_type(fields.get("general.file_type")) or (types.most_common(1)[0][0] if types else None)
    problem = _gguf_problem(path, fields, tensors, data_start, size, architecture, types)
    return ModelSummary(total, architecture, quant, problem)


def _read_header(path: Path) -> tuple[dict, list[_Tensor], int]:
    """(metadata fields, tensor table, where the tensors' data starts): the pages of the header, nothing else."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        cursor = HeaderCursor(mapped)
        tensor_count, key_count = cursor.preamble()
        fields = cursor.fields(key_count)
        tensors = []
        for _ in range(tensor_count):  # as gguf_file.py reads it, without building a view of the data
            name = cursor.string()
            n_dims = cursor.take("I")
            if n_dims > _MOST_DIMS:
                raise GGUFFormatError(f"its tensor {name} has {n_dims} dimensions")
            dims = tuple(cursor.take("Q") for _ in range(n_dims))
            kind = cursor.take("I")
            tensors.append(_Tensor(name, dims, kind, cursor.take("Q")))
        alignment = fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0:
            raise GGUFFormatError("its alignment is not a positive number")
        return fields, tensors, -(-cursor.at // alignment) * alignment


def _gguf_problem(path: Path, fields: dict, tensors: list[_Tensor], data_start: int, size: int,
                  architecture: str | None, types: Counter) -> str | None:
    gguf_architectures, model_types, runnable_types, gguf_config, model_config = _engine_tables()
    split = fields.get("split.count")
    count = split if isinstance(split, int) and split > 1 else (split_part(path) or (1, 1))[1]
    if count > 1:
        return f"split file ({count} parts), which kvchat cannot run yet"
    if architecture is None:
        return "no architecture in its header"
    if gguf_architectures.get(architecture) not in model_types:
        return f"architecture {architecture} not supported"
    unsupported = [name for name, _ in types.most_common() if name not in runnable_types]
    if unsupported:
        return f"quant type{'s' if len(unsupported) > 1 else ''} {', '.join(unsupported)} not supported"
    damage = _past_the_end(tensors, data_start, size)
    if damage:
        return damage
    try:  # the loader's own refusals (RoPE factors and scaling, missing fields, Gemma variants, MoE routing)
        model_config(gguf_config(SimpleNamespace(fields=fields, tensors=tensors)))
    except ModelError as exc:
        return str(exc).rstrip(".")
    except (ValueError, TypeError) as exc:  # a field of the wrong kind (a string where a number belongs)
        return f"metadata the loader cannot read ({exc})"
    return None


def _past_the_end(tensors: list[_Tensor], data_start: int, size: int) -> str | None:
    """Where a tensor's data would end past the file (a download cut short), in a few words."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for tensor in tensors:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.kind)]
        except (ValueError, KeyError):  # a type gguf does not know: its size is not known either
            continue
        count = 1
        for d in tensor.dims:
            count *= d
        if data_start + tensor.offset + count // block * type_size > size:
            return f"truncated (its tensor {tensor.name} ends past the end of the file)"
    return None


@functools.cache
def _engine_tables():
    """(GGUF architecture -> model type, model types built, GGUF types the loader runs, gguf_config,
    ModelConfig.from_dict): imported once, on first use (they import torch)."""
    from engine.cpu.formats import FORMATS
    from engine.config.model import SUPPORTED_ARCHITECTURES, ModelConfig
    from engine.gguf.reader import MODEL_TYPES, gguf_config

    return (MODEL_TYPES, set(SUPPORTED_ARCHITECTURES), {fmt.upper() for fmt in FORMATS} | {"F32"}, gguf_config,
            ModelConfig.from_dict)


def _type_name(kind: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(kind).name
    except ValueError:
        return f"unknown ({kind})"


def _file_type(value) -> str | None:
    """general.file_type as llama.cpp names the file's quantization (7 -> "Q8_0", 15 -> "Q4_K_M")."""
    from gguf.constants import LlamaFileType

    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        name = LlamaFileType(value).name
    except ValueError:
        return None
    return None if name == "GUESSED" else name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _directory(path: Path) -> ModelSummary:
    size = sum(_file_size(Path(root) / name) for root, _, names in os.walk(path) for name in names)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return ModelSummary(size, None, None, "no readable config.json")
    if not isinstance(raw, dict):
        return ModelSummary(size, None, None, "no readable config.json")
    from engine.config.model import MULTIMODAL_WRAPPERS, SUPPORTED_ARCHITECTURES, ModelConfig
    from engine.weights.checkpoint import checkpoint_files

    model_type = raw.get("model_type")
    quantization = raw.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    dtype = raw.get("dtype") or raw.get("torch_dtype")
    quant = str(method) if method else (_FLOAT_NAMES.get(dtype, dtype) if isinstance(dtype, str) else None)
    if not isinstance(model_type, str):
        return ModelSummary(size, None, quant, "no model_type in its config.json")
    if model_type not in SUPPORTED_ARCHITECTURES and model_type not in MULTIMODAL_WRAPPERS:
        return ModelSummary(size, model_type, quant, f"architecture {model_type} not supported")
    if quantization is not None:
        return ModelSummary(size, model_type, quant, f"quantization {method or 'config'} not supported")
    try:
        ModelConfig.from_dict(raw)
    except ModelError as exc:
        return ModelSummary(size, model_type, quant, str(exc).rstrip("."))
    try:
        checkpoint_files(path)
    except ModelError:
        return ModelSummary(size, model_type, quant, "no readable .safetensors weights")
    return ModelSummary(size, model_type, quant)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size  # through a symlink (the Hugging Face cache links blobs)
    except OSError:
        return 0
