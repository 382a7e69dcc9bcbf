"""The C structs the kernels read (csrc/block_quant.h, csrc/decode_step.c, csrc/moe.h) and their ctypes mirrors
(engine/cpu/kernels.py, engine/cpu/decode_step.py) have the same size: a field added, removed or
resized on one side only fails here, not as a misread model in the fused step."""

import ctypes
import shutil

import pytest

from engine.cpu import decode_step
from engine.cpu.kernels import LinearDesc, load_quant_kernels

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the kernels are C code built on this machine")

MIRRORS = {"linear": LinearDesc, "parts": decode_step._Parts, "layer": decode_step._Layer,
           "model": decode_step._Model, "sequence": decode_step._Sequence, "moe": decode_step._Moe}


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_each_c_struct_is_the_size_of_its_ctypes_mirror(name):
    kernels = load_quant_kernels()
    assert not isinstance(kernels, str), kernels
    size = getattr(kernels.lib, f"kc_sizeof_{name}")
    size.restype, size.argtypes = ctypes.c_int64, []
    assert size() == ctypes.sizeof(MIRRORS[name]), f"kc_{name} and {MIRRORS[name].__name__} differ"
