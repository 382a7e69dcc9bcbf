"""MixedQuantLinear: one fused linear (q|k|v, gate|up) whose parts are stored in different formats.

A Q4_K_M GGUF may store a layer's q and k as Q4_K and its v as Q6_K; their blocks cannot be
concatenated into one matrix, so each part stays a QuantLinear and the layer's output is their
outputs side by side. Up to KERNEL_MAX_ROWS rows, one kernel call computes every part's columns
(split between the threads as one matrix's would be); more rows go through each part's
dequantize+GEMM path. Each output column is the one its part alone would give, bit for bit.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from engine.cpu.kernels import LinearDesc
from engine.cpu.linear import QuantLinear, kernel_forward


class MixedQuantLinear(nn.Module):
    def __init__(self, parts: list[QuantLinear]):
        """`parts`: the layer's weights in output order, all with the same in_features."""
        super().__init__()
        if len({part.in_features for part in parts}) != 1:
            raise ValueError("the parts of a fused linear must share their input size")
        self.parts = nn.ModuleList(parts)
        self.kernels = parts[0].kernels
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)
        # Integer products if any part has them (kernel_forward then sends every row count to the kernel,
        # which runs each part the way it is asked to).
        self.integer = any(part.integer for part in parts)
        self._bind_kernels()

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, parts in {'/'.join(p.fmt for p in self.parts)}"

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)  # the parts rebind their own addresses
        self._bind_kernels()
        return module

    def _bind_kernels(self) -> None:
        descs = [part.kernel_desc(with_bias=False) for part in self.parts]
        self._descs = (LinearDesc * len(descs))(*descs)  # kept: the kernel reads it on every call
        lib, address, count = self.kernels.lib, ctypes.addressof(self._descs), len(descs)
        self._matmul = lambda x, rows, y, t: lib.kc_matmul_parts(address, count, x, rows, y, t)
        biases = [part.bias for part in self.parts]
        self._bias = None if all(b is None for b in biases) else torch.cat(
            [torch.zeros(p.out_features) if b is None else b for p, b in zip(self.parts, biases)])

    def kernel_descs(self) -> list[tuple[LinearDesc, int]]:
        """(kc_linear with its bias, first output column) of every part, for callers that run the kernels
        themselves (the fused decode step). The addresses are this module's buffers': keep the module."""
        descs, first = [], 0
        for part in self.parts:
            descs.append((part.kernel_desc(), first))
            first += part.out_features
        return descs

    def dequantized_matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [count, in] fp32 times the weight (no bias), each part through its own dequantize+GEMM."""
        return torch.cat([part.dequantized_matmul(rows) for part in self.parts], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_forward(self, x)
