"""GGUFFile: a GGUF file's metadata and tensor table, its tensor data mapped (copy-on-write, never written).

gguf.GGUFReader builds a numpy view for every element of every metadata array: 2 s for SmolLM2's
49K-token vocabulary, far more for a 152K one, on every start. The loader needs the scalar fields, the
tensor table and the mapping; the vocabulary is transformers' business (gguf_cache.py), so long arrays
are stepped over here and only their length is kept (SkippedArray). Tensors come as the reader gives
them (GGUFTensor: name, GGUF-order shape, type, and `data` shaped as the reader shapes it: quantized and
BF16 tensors as bytes [..., bytes a row], F16/F32 as values), so gguf.quants.dequantize reads them.

    magic "GGUF", u32 version (2, 3), u64 tensor count, u64 key count,
    per key: string, u32 type, value (string: u64 length + bytes; array: u32 type, u64 count, elements),
    per tensor: string name, u32 dims, u64 dims..., u32 type, u64 offset; data at the next alignment.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_ARRAY_KEPT = 4096  # longer arrays (a vocabulary, its merges and scores) are stepped over
_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


class GGUFFormatError(Exception):
    """The file is not a GGUF file this parser reads, or is cut short (one phrase)."""


class TensorTableDamage(GGUFFormatError):
    """A readable header whose tensor table does not fit the file: data cut short, rows not whole blocks."""


@dataclass(frozen=True)
class SkippedArray:
    """A long metadata array stepped over: only its length is known."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the row length first
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # a view of the mapping (see the module's docstring)


class _Cursor:
    def __init__(self, buffer: memoryview):
        self.buffer, self.at = buffer, 0

    def take(self, fmt: str):
        try:
            value = struct.unpack_from("<" + fmt, self.buffer, self.at)[0]
        except struct.error:
            raise GGUFFormatError("it ends inside its header") from None
        self.at += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.take("Q")
        if self.at + length > len(self.buffer):
            raise GGUFFormatError("it ends inside its header")
        text = bytes(self.buffer[self.at : self.at + length]).decode("utf-8", "replace")
        self.at += length
        return text

    def skip_string(self) -> None:
        length = self.take("Q")  # read first: `self.at += self.take(...)` would add to the old position
        self.at += length

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFFormatError(f"a metadata value has the unknown type {kind}")
        element, count = self.take("I"), self.take("Q")
        if count <= _MAX_ARRAY_KEPT:
            return [self.value(element) for _ in range(count)]
        if element in _SCALARS:
            self.at += struct.calcsize("<" + _SCALARS[element]) * count
        elif element == _STRING:
            for _ in range(count):  # each string has its own length
                self.skip_string()
        else:
            for _ in range(count):
                self.value(element)
        if self.at > len(self.buffer):
            raise GGUFFormatError("it ends inside its header")
        return SkippedArray(count)


class GGUFFile:
    def __init__(self, path: Path):
        """Map `path` and read its header; GGUFFormatError (one phrase) if it is not a readable GGUF file."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.data = np.memmap(path, mode="c")  # copy-on-write: tensors may view it, the file is never written
        cursor = _Cursor(memoryview(self.data))
        if len(self.data) < 24 or bytes(self.data[:4]) != b"GGUF":
            raise GGUFFormatError("it does not start with the GGUF magic")
        cursor.at = 4
        version = cursor.take("I")
        if version not in (2, 3):
            raise GGUFFormatError(f"its version {version} is not 2 or 3")
        tensor_count, key_count = cursor.take("Q"), cursor.take("Q")
        if tensor_count > len(self.data) or key_count > len(self.data):
            raise GGUFFormatError("its counts are larger than the file")
        self.fields: dict[str, Any] = {}
        for _ in range(key_count):
            key = cursor.string()
            self.fields[key] = cursor.value(cursor.take("I"))
        table = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
            raw_type, offset = cursor.take("I"), cursor.take("Q")
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise GGUFFormatError(f"its tensor {name} has the unknown type {raw_type}") from None
            table.append((name, dims, qtype, offset))
        alignment = self.fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0:
            raise GGUFFormatError("its alignment is not a positive number")
        start = -(-cursor.at // alignment) * alignment
        self.tensors = [self._tensor(name, dims, qtype, start + offset, GGML_QUANT_SIZES[qtype])
                        for name, dims, qtype, offset in table]

    def _tensor(self, name: str, dims: tuple[int, ...], qtype, at: int, sizes: tuple[int, int]) -> GGUFTensor:
        block, type_size = sizes
        if dims and dims[0] % block:
            raise TensorTableDamage(f"its tensor {name} has rows of {dims[0]} weights, which {qtype.name}'s "
                                  f"{block}-weight blocks do not divide")
        count = int(np.prod(dims, dtype=np.int64))
        end = at + count // block * type_size
        if end > len(self.data):
            raise TensorTableDamage(f"its tensor {name} ends at byte {end:,}, but the file has {len(self.data):,} "
                                  "bytes (truncated?)")
        shape = tuple(reversed(dims))
        if qtype.name in _NUMPY:
            data = self.data[at:end].view(_NUMPY[qtype.name]).reshape(shape)
        else:  # quantized (and BF16, which numpy lacks): bytes, a row's blocks in the last dimension
            data = self.data[at:end].reshape(*shape[:-1], shape[-1] // block * type_size)
        return GGUFTensor(name, dims, qtype, data)
