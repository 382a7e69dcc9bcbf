"""AMX (csrc/int8_amx.h): the K-quant tiles' integer sums from Intel's matrix unit must give the vector code's
bits and the definition's, for every row count (one and two 16-row tiles, their remainders, blocks of rows
past the one a weight's unpacked bytes are kept for) and at the largest sums the formats can make.

These run where the CPU has AMX-INT8 and Linux lends it to the process; elsewhere the matrix unit never runs
and the vector code's own tests (test_int8_products.py) are what holds."""

import numpy as np
import pytest
import torch

from engine.cpu import kernels as quant_kernels
from engine.cpu.linear import QuantLinear
from tests.engine.cpu.test_int8_products import bits, defined, int8_linear

AMX_FORMATS = ["q4_k", "q5_k", "q6_k"]
# rows: under the thresholds (vector code), one tile, a tile and a remainder, two tiles, past two
ROW_COUNTS = [7, 8, 13, 14, 16, 17, 31, 32, 33, 61]


@pytest.fixture(scope="module")
def kernels():
    loaded = quant_kernels.load_quant_kernels()
    assert not isinstance(loaded, str), loaded
    if not loaded.lib.kc_amx_active():
        pytest.skip("this CPU, or its OS, does not lend AMX-INT8: the vector code is all that runs here")
    return loaded.with_integer_products(True)


def with_amx(kernels, on, fn):
    """fn() with the matrix unit on or off (the vector code), restored after."""
    kernels.lib.kc_amx_set(int(on))
    try:
        return fn()
    finally:
        kernels.lib.kc_amx_set(1)


@pytest.mark.parametrize("fmt", AMX_FORMATS)
def test_the_matrix_unit_gives_the_vector_codes_and_the_definitions_bits(kernels, fmt):
    linear, _ = int8_linear(kernels, fmt, rows=40, bias=torch.randn(40))
    for rows in ROW_COUNTS:
        x = torch.randn(rows, linear.in_features) * 3
        amx = with_amx(kernels, True, lambda: linear(x))
        vector = with_amx(kernels, False, lambda: linear(x))
        assert torch.equal(bits(amx), bits(vector)), rows
        assert torch.equal(bits(amx), bits(defined(linear, x) + linear.bias)), rows


def test_rows_past_a_block_of_rows_get_the_same_bits(kernels):
    """K = 8,960 (a 1.5B model's down projection): the unpacked bytes serve 96 rows at a time; 200 rows take
    three blocks, the last a part."""
    linear, _ = int8_linear(kernels, "q6_k", rows=24, cols=8960, seed=4)
    x = torch.randn(200, linear.in_features)
    amx = with_amx(kernels, True, lambda: linear(x))
    vector = with_amx(kernels, False, lambda: linear(x))
    assert torch.equal(bits(amx), bits(vector))
    assert torch.equal(bits(amx[150:170]), bits(with_amx(kernels, True, lambda: linear(x[150:170]))))


def saturated(fmt, rows, cols, high_quants):
    """Blocks at the ends of the formats' ranges, d = dmin = 2^-10: every quant at its largest (or 0) and every
    sub-scale at its largest magnitude (Q4_K/Q5_K 63; Q6_K -128, whose u = 0 makes each weight -128 * (0 - 32):
    4,096 d, the largest a K-quant holds). With every activation quant at +-127 these are the largest sums."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.upper()]]
    raw = np.full((rows, cols // block, size), 0xFF if high_quants else 0x00, dtype=np.uint8)
    half = np.array([2.0 ** -10], dtype=np.float16).view(np.uint8)
    if fmt == "q6_k":
        raw[:, :, 192:208] = 0x80
        raw[:, :, 208:210] = half
    else:
        raw[:, :, 4:16] = 0xFF  # 6-bit scales and minimums, all 63
        raw[:, :, 0:2] = half
        raw[:, :, 2:4] = half
    return torch.from_numpy(raw.reshape(rows, -1))


@pytest.mark.parametrize("fmt", AMX_FORMATS)
@pytest.mark.parametrize("high_quants", [True, False])
def test_the_largest_sums_the_formats_make_do_not_overflow(kernels, fmt, high_quants):
    linear = QuantLinear(kernels, fmt, saturated(fmt, 32, 1024, high_quants))
    x = torch.ones(40, linear.in_features)  # every activation quant +-127
    x[1::2] = -1.0
    amx = with_amx(kernels, True, lambda: linear(x))
    vector = with_amx(kernels, False, lambda: linear(x))
    assert torch.equal(bits(amx), bits(vector))
    assert torch.equal(bits(amx), bits(defined(linear, x)))
    assert torch.isfinite(amx).all() and amx.abs().min() > 0


def test_the_integer_products_name_the_matrix_unit_while_it_runs(kernels):
    assert kernels.integer_isa == "avx512-vnni+amx"
    assert kernels.lib.kc_amx_set(0) == 0
    try:
        assert kernels.lib.kc_int8_isa() == b"avx512-vnni"
    finally:
        assert kernels.lib.kc_amx_set(1) == 1
