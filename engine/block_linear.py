"""BlockQuantLinear: a linear layer whose weight stays in GGUF blocks (Q4_1 or Q8_0).

The weight values are the dense fp32 checkpoint's, bit for bit (the kernels
rebuild each weight exactly as the conversion did), so outputs differ from a
dense fp32 matmul only in summation order. A decode step reads 0.75 (Q4_1) or
1.125 (Q8_0) bytes per weight instead of 4.

A few rows (decode) go through the matvec kernel; more rows (prefill) through
a dequantized copy of the weight in a per-thread scratch buffer, which stays
in the CPU cache, and torch's GEMM.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from engine.block_kernels import BlockKernels

FORMATS = ("q4_1", "q8_0")
BLOCK = 32
_scratch = threading.local()


def _scratch_buffer(numel: int) -> torch.Tensor:
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < numel:
        buffer = _scratch.buffer = torch.empty(numel, dtype=torch.float32)
    return buffer[:numel]


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class BlockQuantLinear(nn.Module):
    def __init__(self, kernels: BlockKernels, fmt: str, qs: torch.Tensor, d: torch.Tensor,
                 m: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown block format {fmt!r}")
        self.kernels, self.fmt = kernels, fmt
        self.out_features = d.shape[0]
        self.in_features = d.shape[1] * BLOCK
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("d", d.to(torch.float32).contiguous())
        self.register_buffer("m", None if m is None else m.to(torch.float32).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(torch.float32))

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.fmt} blocks, {self.kernels.isa}"

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight [out, in], in a scratch buffer reused by the next call on this thread."""
        n, k = self.out_features, self.in_features
        w = _scratch_buffer(n * k)
        threads = torch.get_num_threads()
        if self.fmt == "q4_1":
            self.kernels.lib.q4_1_dequantize(_ptr(self.qs), _ptr(self.d), _ptr(self.m), n, k, _ptr(w), threads)
        else:
            self.kernels.lib.q8_0_dequantize(_ptr(self.qs), _ptr(self.d), n, k, _ptr(w), threads)
        return w.view(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.float32).contiguous()
        if rows.shape[0] > self.kernels.max_rows:
            y = F.linear(rows, self.dequantized())
        else:
            y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
            lib, n, threads = self.kernels.lib, self.out_features, torch.get_num_threads()
            if self.fmt == "q4_1":
                lib.q4_1_matvec(_ptr(rows), rows.shape[0], self.in_features, _ptr(self.qs), _ptr(self.d),
                                _ptr(self.m), n, _ptr(y), threads)
            else:
                lib.q8_0_matvec(_ptr(rows), rows.shape[0], self.in_features, _ptr(self.qs), _ptr(self.d),
                                n, _ptr(y), threads)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)
