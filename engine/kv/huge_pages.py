"""Transparent huge pages for the large CPU K/V buffers (the pool, working copies), where Linux allows.

A fresh buffer's first write faults in every 4 KiB page: 35-47 ms for the 94 MB that 2k tokens of
SmolLM2 take in fp32, paid by the first request after start and by a resume that reads K/V from disk
into the pool. Asked for 2 MiB pages (madvise MADV_HUGEPAGE; the default where THP is "madvise"), the
same write takes ~10 ms. The buffers' contents and addresses do not change; only how the kernel backs
them. Where it cannot be asked (not Linux, THP off, a GPU tensor) nothing happens.
"""

from __future__ import annotations

import ctypes
import sys

import torch

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20
PAGE = 4096

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def advise_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    """Ask for huge pages under `tensor` (a large, untouched CPU tensor); returns it."""
    if _madvise is None or tensor.device.type != "cpu" or tensor.nbytes < 2 * HUGE_PAGE:
        return tensor
    start = tensor.data_ptr()
    begin = -(-start // PAGE) * PAGE  # madvise takes whole pages; the kernel uses huge ones inside the range
    end = (start + tensor.nbytes) // PAGE * PAGE
    if end > begin:
        _madvise(begin, end - begin, MADV_HUGEPAGE)  # a refusal (EINVAL: THP off) leaves ordinary pages
    return tensor
