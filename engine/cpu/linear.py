"""QuantLinear: a linear layer whose weight stays in its stored format (GGUF blocks, bf16, f16).

The weight values are the dense fp32 model's, bit for bit (the kernels rebuild
each weight exactly as gguf.quants.dequantize does), so outputs differ from a
dense fp32 matmul only in summation order. The stored tensor is kept as given:
a GGUF file's blocks stay views of its mapping (gguf/reader.py). A decode step
reads what the format costs per weight (Q4_K 0.5625 bytes, Q8_0 1.125, bf16 2) instead of 4.
engine/cpu/formats.py lists the formats and how each is stored.

Up to KERNEL_MAX_ROWS rows (decode, follow-up messages, short prompts) go
through the block kernel, which decodes each weight once per 8 rows; more rows
through a dequantized copy of the weight (a per-thread scratch buffer that
stays in the CPU cache) and torch's GEMM, which wins on long prompts.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu.formats import BLOCK, FORMATS, in_features
from engine.cpu.kernels import FLAG_INTEGER, FORMAT_CODES, LinearDesc, QuantKernels

# Measured on a 2-core AVX-512 CPU, whole SmolLM2-135M forward, interleaved medians of 5
# (kernel / dequantize+GEMM / transformers' dense fp32): 24 tokens 74 / 116 / 110 ms,
# 64 tokens 160 / 156 / 149 ms, 128 tokens 330 / 266 / 249 ms.
KERNEL_MAX_ROWS = 48
# Weight rows per dequantize+GEMM slice. 128-token forward, interleaved medians of 15:
# one GEMM per matrix 289 ms, 1536-row slices 273 ms, 768-row slices 268 ms (dense fp32: 280 ms).
GEMM_ROWS = 768
TILE = 16  # output columns a tile holds (csrc/int8_tiles.h)
PACK_BYTES = 8 << 20  # a matrix's blocks read into tiles per call (then their pages may go)
_scratch = threading.local()


def _scratch_buffer(numel: int) -> torch.Tensor:
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < numel:
        buffer = _scratch.buffer = torch.empty(numel, dtype=torch.float32)
    return buffer[:numel]


def _integer_format(kernels: QuantKernels, code: int) -> bool:
    """Whether a weight in format `code` multiplies in integers when they are asked for: where this build
    has their vector code (Q2_K has none: its definition in plain C is slower than its fp32 kernel, so it
    keeps fp32 products); a build with no vector integer code at all (integer_isa
    "portable", built for the tests of the definition) runs the definition for every format."""
    if not kernels.lib.kc_int8_supported(code):
        return False
    return kernels.integer_isa == "portable" or bool(kernels.lib.kc_int8_vector(code))


class QuantLinear(nn.Module):
    def __init__(self, kernels: QuantKernels, fmt: str, qs: torch.Tensor, bias: torch.Tensor | None = None,
                 read: Callable[[torch.Tensor], None] | None = None):
        """`qs`: the weight as formats.py stores `fmt` (kept, not copied: it may view a mapped GGUF file);
        `bias` [out] or None; `read`: told of qs's leading rows as the tiles are made from them (the
        loader drops a mapped file's pages under them: WeightSource.release)."""
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown block format {fmt!r}")
        self.kernels, self.fmt = kernels, fmt
        # Integer products (csrc/int8_dot.h) where the kernels are asked for them and the format has them
        # (bf16/f16 weights always multiply in fp32).
        self.integer = kernels.integer and _integer_format(kernels, FORMAT_CODES[fmt])
        self.out_features = qs.shape[0]
        self.in_features = in_features(fmt, qs)
        if self.in_features % BLOCK:
            raise ValueError(f"{fmt} rows of {self.in_features} weights are not whole {BLOCK}-weight blocks")
        if qs.is_floating_point():  # bf16/f16: kept as their bits, so a model-wide .to(dtype) leaves them alone
            qs = qs.contiguous().view(torch.int16)
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(torch.float32))
        # Integer products read the weight repacked into tiles (csrc/int8_tiles.h: the same bytes as its
        # blocks, laid out 16 output columns a vector), made once here; not saved with the module.
        self.register_buffer("tiles", self._tiles(read) if self.integer else None, persistent=False)
        self._bind_kernels()

    def extra_repr(self) -> str:
        products = f"int8 products ({self.kernels.integer_isa})" if self.integer else f"fp32 products ({self.kernels.isa})"
        return f"{self.in_features} -> {self.out_features}, {self.fmt} blocks, {products}"

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        self._bind_kernels()  # tensors may have moved: rebind their addresses
        return module

    def _bind_kernels(self) -> None:
        # Plain attributes, not buffer lookups: this is called ~120 times per decoded token.
        self.desc = self.kernel_desc(with_bias=False)  # the bias is added in torch (it is on the GEMM path too)
        lib, desc = self.kernels.lib, ctypes.byref(self.desc)
        self._matmul = lambda x, rows, y, t: lib.kc_matmul(desc, x, rows, y, t)
        self._dequantize = lambda w, first, count, t: lib.kc_dequantize(desc, first, count, w, t)
        self._bias = self.bias

    def _tiles(self, read: Callable[[torch.Tensor], None] | None) -> torch.Tensor | None:
        desc = self.kernel_desc(with_bias=False)  # the blocks alone: no tiles yet
        size = self.kernels.lib.kc_int8_tile_bytes(ctypes.byref(desc))
        if size <= 0:  # this build has no tiles for the format: the definition reads the blocks
            return None
        tiles = torch.empty(size, dtype=torch.uint8)
        # Made in ranges of ~PACK_BYTES of blocks, each range's blocks handed to `read` once packed: a mapped
        # file's pages then leave resident memory as they are read, not once the whole matrix is (the tied
        # embedding and head of a 1.5B model is 180 MB, which was the load's peak above its end state).
        count = -(-self.out_features // TILE)
        step = max(1, PACK_BYTES // max(1, self.qs[:TILE].numel() * self.qs.element_size()))
        for first in range(0, count, step):
            end = min(count, first + step)
            self.kernels.lib.kc_int8_tile_pack(ctypes.byref(desc), tiles.data_ptr(), first, end,
                                               torch.get_num_threads())
            if read is not None:
                read(self.qs[: end * TILE])
        return tiles

    def kernel_desc(self, with_bias: bool = True) -> LinearDesc:
        """The weight as csrc/block_quant.h's kc_linear (addresses of this module's buffers: keep it)."""
        tiles = getattr(self, "tiles", None)
        return LinearDesc(FORMAT_CODES[self.fmt], self.out_features, self.in_features,
                          FLAG_INTEGER if self.integer else 0, self.qs.data_ptr(),
                          0 if tiles is None else tiles.data_ptr(),
                          self.bias.data_ptr() if with_bias and self.bias is not None else 0)

    def kernel_descs(self) -> list[tuple[LinearDesc, int]]:
        """(kc_linear, first output column) of each part of this layer: one, at column 0."""
        return [(self.kernel_desc(), 0)]

    def dequantized(self, first: int = 0, count: int | None = None) -> torch.Tensor:
        """Weight rows first..first+count as fp32 [count, in], in a scratch buffer the next call reuses."""
        count = self.out_features - first if count is None else count
        w = _scratch_buffer(count * self.in_features)
        self._dequantize(w.data_ptr(), first, count, torch.get_num_threads())
        return w.view(count, self.in_features)

    def dequantized_matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [count, in] fp32 times the weight (no bias), through dequantized copies and torch's GEMM."""
        # Row slices keep each dequantized operand small enough to stay in cache for its GEMM.
        if self.out_features <= GEMM_ROWS:
            return F.linear(rows, self.dequantized())
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        for first in range(0, self.out_features, GEMM_ROWS):
            count = min(GEMM_ROWS, self.out_features - first)
            y[:, first : first + count] = F.linear(rows, self.dequantized(first, count))
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_forward(self, x)


def kernel_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] -> [..., out] through `layer`'s kernel (_matmul) up to KERNEL_MAX_ROWS rows, else its
    dequantized_matmul, plus its _bias: the forward of QuantLinear and MixedQuantLinear. Integer products
    take every row count through the kernel: a row's result must not depend on the chunk it is in."""
    rows = x.reshape(-1, layer.in_features)
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.to(torch.float32).contiguous()
    count = rows.shape[0]
    if count > KERNEL_MAX_ROWS and not layer.integer:
        y = layer.dequantized_matmul(rows)
    else:
        y = torch.empty(count, layer.out_features, dtype=torch.float32)
        layer._matmul(rows.data_ptr(), count, y.data_ptr(), torch.get_num_threads())
    if layer._bias is not None:
        y = y + layer._bias
    return y.view(*x.shape[:-1], layer.out_features)
