"""GGUFFile: a GGUF file's metadata and tensor table, its tensor data mapped (copy-on-write, never written).

The metadata is read by header.py (long arrays such as the vocabulary stepped over). Tensors come as
gguf.GGUFReader gives them (GGUFTensor: name, GGUF-order shape, type, and `data` shaped as the reader
shapes it: quantized and BF16 tensors as bytes [..., bytes a row], F16/F32 as values), so
gguf.quants.dequantize reads them.

    after the metadata, per tensor: string name, u32 dims, u64 dims..., u32 type, u64 offset;
    data at the next multiple of general.alignment.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf.header import GGUFFormatError, HeaderCursor

_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


class TensorTableDamage(GGUFFormatError):
    """A readable header whose tensor table does not fit the file: data cut short, rows not whole blocks."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF's order: the row length first
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # a view of the mapping (see the module's docstring)


class GGUFFile:
    def __init__(self, path: Path):
        """Map `path` and read its header; GGUFFormatError (one phrase) if it is not a readable GGUF file."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.data = np.memmap(path, mode="c")  # copy-on-write: tensors may view it, the file is never written
        cursor = HeaderCursor(memoryview(self.data))
        tensor_count, key_count = cursor.preamble()
        self.fields: dict[str, Any] = cursor.fields(key_count)
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

    def release(self, address: int, nbytes: int) -> None:
        """Drops this process's pages of bytes [address, address + nbytes) of the mapping, where they are
        whole pages of it: a copy of them (the integer products' tiles) serves from now on, so the file's
        pages need not count twice in the resident memory. A later read (an embedding row) faults them back
        in from the file, unchanged: nothing of the mapping is ever written."""
        base, size = self.data.ctypes.data, len(self.data)
        page = mmap.PAGESIZE
        lo, hi = max(address, base), min(address + nbytes, base + size)
        lo, hi = -(-(lo - base) // page) * page, (hi - base) // page * page
        if hi > lo:
            self.data._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

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
