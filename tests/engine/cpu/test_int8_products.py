"""Integer products (csrc/int8_dot.h): quantized weights times int8 activations, summed in int32.

What must hold: every vector path gives the definition's bits (the portable code, also compiled for a plain
x86-64); a row's result does not depend on the rows it is multiplied with or on the thread split; and the
result is the product of the quantized activations with the exact weights up to fp32 rounding, which a
numpy reimplementation of the activation quantization checks independently of the C code."""

import ctypes
import shutil

import numpy as np
import pytest
import torch

from engine.cpu import kernels as quant_kernels
from engine.cpu import linear as linear_module
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
from tests.cpu_builds import AVX2_TILE_BUILDS, can_run
from tests.kquant_blocks import MXFP4_SUBNORMAL, mxfp4_blocks, random_blocks

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")

K_QUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"]  # 256-weight super-blocks, Q8_K-style activations
LEGACY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "iq4_nl"]  # 32-weight blocks, Q8_0-style activations
FORMATS = LEGACY + K_QUANTS
DEFINITION_ONLY = ["q2_k"]  # no vector code: integer products only where the definition runs
VECTOR = [fmt for fmt in FORMATS if fmt not in DEFINITION_ONLY]
SCALE = {"q4_0": 0.1, "q5_0": 0.05, "q5_1": 0.03, "q2_k": 0.02, "q3_k": 0.005, "q4_k": 1e-3, "q5_k": 5e-4,
         "q6_k": 2.5e-4, "mxfp4": 1.0, "iq4_nl": 0.01, "iq4_xs": 3e-4}


@pytest.fixture(scope="module")
def native():
    loaded = quant_kernels.load_quant_kernels()
    assert not isinstance(loaded, str), loaded
    return loaded.with_integer_products(True)


@pytest.fixture(scope="module")
def portable():
    """The definition alone: the kernels built for a plain x86-64, every format in integers."""
    loaded = quant_kernels.kernels_for("x86-64").with_integer_products(True)
    assert loaded.integer_isa == "portable"
    return loaded


@pytest.fixture
def integer_kernels(request, native, portable):
    """The kernels that run `fmt` in integers: this CPU's vector code, or the definition for Q2_K."""
    return portable if request.getfixturevalue("fmt") in DEFINITION_ONLY else native


def weights(fmt, rows, cols, seed):
    """(QuantLinear's stored blocks, the exact weights as fp64) of a random matrix."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    if fmt in ("q4_1", "q8_0"):  # quantized by gguf from N(0, 1) weights (no random_blocks scale for them)
        raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    else:
        raw = random_blocks(fmt.upper(), rows, cols, rng, SCALE[fmt])
    return torch.from_numpy(raw), np.asarray(dequantize(raw, qtype), dtype=np.float64)


def int8_linear(kernels, fmt, rows=40, cols=None, seed=0, bias=None):
    cols = cols or (512 if fmt in K_QUANTS else 544)  # 544: an odd count of 32-weight blocks
    qs, dense = weights(fmt, rows, cols, seed)
    return QuantLinear(kernels, fmt, qs, bias), dense


def quantized_activations(x, fmt):
    """numpy's own int8 quantization of x's rows (int8_act.h), dequantized: d * q per block, fp64."""
    block = 256 if fmt in K_QUANTS else 32
    x = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(x).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(x * inverse)  # float32 multiply, then round half to even
    d = (amax / np.float32(127)).astype(np.float32)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape[0], -1)


def bits(t):
    return t.contiguous().view(torch.int32)


def defined(linear, x):
    """The definition's result (the portable loops, whatever this CPU has)."""
    y = torch.empty(x.shape[0], linear.out_features)
    linear.kernels.lib.kc_int8_columns_defined(ctypes.byref(linear.desc), x.data_ptr(), x.shape[0], y.data_ptr(),
                                               linear.out_features, 0, linear.out_features)
    return y


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_product_is_the_quantized_activations_times_the_exact_weights(integer_kernels, fmt):
    linear, dense = int8_linear(integer_kernels, fmt)
    assert linear.integer
    x = torch.randn(5, linear.in_features)
    expected = quantized_activations(x.numpy(), fmt) @ dense.T
    got = linear(x).double().numpy()
    # Only fp32 rounding separates them: the integer sums are exact.
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    # and int8 activations cost about 1% against the fp32 product
    exact = x.double().numpy() @ dense.T
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 0.02


@pytest.mark.parametrize("fmt", VECTOR)
def test_the_vector_path_gives_the_definitions_bits(native, fmt):
    linear, _ = int8_linear(native, fmt, bias=torch.randn(40))
    x = torch.randn(7, linear.in_features) * 3
    assert torch.equal(bits(linear(x)), bits(defined(linear, x) + linear.bias))


@pytest.mark.slow
@pytest.mark.parametrize("march", ["x86-64", "haswell"])
def test_every_instruction_set_gives_the_same_bits(native, march):
    """The portable C (x86-64) runs the definition, an AVX2 build its 8-column tiles, this CPU its own code."""
    other = quant_kernels.kernels_for(march).with_integer_products(True)
    for fmt in VECTOR:
        here, _ = int8_linear(native, fmt, seed=3)
        there = QuantLinear(other, fmt, here.qs)
        x = torch.randn(6, here.in_features)
        assert torch.equal(bits(here(x)), bits(there(x))), fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_gets_the_same_bits_alone_or_among_any_number_of_rows(integer_kernels, fmt):
    linear, _ = int8_linear(integer_kernels, fmt)
    x = torch.randn(61, linear.in_features)
    together = linear(x)  # 61 rows: past the fp32 path's kernel limit, integer products stay in the kernel
    for count in (1, 2, 3, 4, 5, 6, 7, 8, 9, 48):  # every pass size: 4 rows a K-quant's pass, 8 the others'
        assert torch.equal(bits(linear(x[:count])), bits(together[:count])), count
    assert torch.equal(bits(linear(x[30:31])), bits(together[30:31]))


@pytest.mark.parametrize("fmt", VECTOR)
def test_tiles_take_the_bytes_of_the_files_blocks(native, fmt):
    """The repacked copy the vector code reads (csrc/int8_tiles.h) is GGUF's bytes in another order: the
    K-quants' 6-bit scales unpacked to bytes cost Q4_K 2.8%, Q5_K 2.3% and IQ4_XS 1.5%, Q3_K's 3-bit quants held in
    nibbles 33%; a last tile is padded to 16."""
    linear, _ = int8_linear(native, fmt, rows=64)
    assert linear.tiles is not None
    ratio = linear.tiles.numel() / linear.qs.numel()
    assert ratio == pytest.approx({"q4_k": 2368 / 2304, "q5_k": 2880 / 2816, "iq4_xs": 2208 / 2176,
                                   "q3_k": 2336 / 1760}.get(fmt, 1.0))
    padded, _ = int8_linear(native, fmt, rows=65)
    assert padded.tiles.numel() == linear.tiles.numel() * 5 // 4


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q8_0"])
def test_tiles_packed_range_by_range_are_the_tiles_of_one_pack_and_each_range_is_handed_back_read(
        native, fmt, monkeypatch):
    """A loader drops a mapped file's pages as the tiles are made from them (the load's peak memory): the
    tiles made 3 at a time (the last range short, the last tile padded) are those of one call, and `read` is
    told of the blocks' leading rows as each range is packed, ending with all of them."""
    qs, _ = weights(fmt, 16 * 8 + 5, 512, seed=3)
    whole = QuantLinear(native, fmt, qs)
    assert whole.tiles is not None
    monkeypatch.setattr(linear_module, "PACK_BYTES", 3 * 16 * qs[0].numel())
    told = []
    ranges = QuantLinear(native, fmt, qs, read=lambda rows: told.append((rows.data_ptr(), rows.shape[0])))
    assert torch.equal(ranges.tiles, whole.tiles)
    assert told == [(qs.data_ptr(), rows) for rows in (48, 96, 133)]


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q5_1", "q8_0", "mxfp4"])
def test_columns_that_cut_through_tiles_are_computed_and_the_others_left_alone(native, fmt):
    """A thread (or a fused layer's part) may own columns that start and end inside a 16-column tile."""
    linear, _ = int8_linear(native, fmt, rows=40, bias=torch.randn(40))
    x = torch.randn(6, linear.in_features)
    full = linear(x)  # the module adds its bias in torch: the same float addition the kernel makes
    assert_column_ranges(linear, x, full, [(5, 37), (16, 32), (0, 3), (33, 40)])


def assert_column_ranges(linear, x, full, ranges):
    """Each range n0..n1 of the product's columns computed alone gives full's bits there, and leaves the other
    columns as they were."""
    rows, cols = full.shape
    for n0, n1 in ranges:
        y = torch.full((rows, cols), 7.0)
        desc = linear.kernel_desc(with_bias=True)
        linear.kernels.lib.kc_linear_columns(ctypes.byref(desc), ctypes.c_void_p(x.data_ptr()), rows,
                                             ctypes.c_void_p(y.data_ptr()), cols, n0, n1)
        assert torch.equal(bits(y[:, n0:n1]), bits(full[:, n0:n1])), (n0, n1)
        outside = torch.cat([y[:, :n0], y[:, n1:]], dim=1)
        assert torch.equal(outside, torch.full_like(outside, 7.0)), (n0, n1)


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q4_1", "q8_0", "mxfp4"])
def test_the_thread_split_does_not_change_a_bit(native, fmt):
    linear, _ = int8_linear(native, fmt, rows=70)
    x = torch.randn(3, linear.in_features)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = linear(x)
        torch.set_num_threads(max(2, threads))
        split = linear(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(bits(alone), bits(split))


def test_mxfp4_columns_at_every_scale_give_the_definitions_bits_and_the_exact_product(native):
    """Each output column's weights at one E8M0 exponent, from the subnormal scales (e 0, 1: the tiles'
    other branch of e8m0_to_fp32_half) to large ones: a column's result then has its own magnitude, so a
    scale the tiles decode wrongly shows in its bits (mixed into a column of ordinary blocks it would not)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(9)
    column_exponents = np.concatenate([MXFP4_SUBNORMAL, np.linspace(-123, 100, 46).astype(np.int64)])
    raw = mxfp4_blocks(48, 544, rng, np.repeat(column_exponents, 544 // 32))
    assert {0, 1} <= set(raw.reshape(-1, 17)[:, 0])
    linear = QuantLinear(native, "mxfp4", torch.from_numpy(raw), bias=torch.zeros(48))
    x = torch.randn(5, 544)
    got = linear(x)
    assert torch.equal(bits(got), bits(defined(linear, x) + linear.bias))
    expected = quantized_activations(x.numpy(), "mxfp4") @ np.asarray(dequantize(raw, GGMLQuantizationType.MXFP4),
                                                                      dtype=np.float64).T
    # per column, relative to its scale: the subnormal columns' d * dx keeps ~15 significant bits
    scale = np.ldexp(1.0, column_exponents)
    np.testing.assert_allclose(got.double().numpy() / scale, expected / scale, rtol=1e-4, atol=1e-3)


def test_a_row_with_a_nan_gives_nan_and_leaves_the_other_rows_alone(native):
    linear, _ = int8_linear(native, "q4_k")
    x = torch.randn(3, linear.in_features)
    clean = linear(x)
    x[1, 7] = float("nan")
    y = linear(x)
    assert torch.isnan(y[1]).all()
    assert torch.equal(bits(y[0]), bits(clean[0])) and torch.equal(bits(y[2]), bits(clean[2]))


def test_a_zero_row_gives_zeros(native):
    linear, _ = int8_linear(native, "q6_k")
    assert torch.equal(linear(torch.zeros(2, linear.in_features)), torch.zeros(2, linear.out_features))


def test_a_fused_linear_in_two_formats_gives_each_parts_integer_columns(native):
    q, _ = int8_linear(native, "q4_k", rows=24, seed=5)
    v, _ = int8_linear(native, "q6_k", rows=8, seed=6)
    fused = MixedQuantLinear([q, v])
    assert fused.integer
    x = torch.randn(50, q.in_features)
    assert torch.equal(bits(fused(x)), bits(torch.cat([q(x), v(x)], dim=1)))


@pytest.mark.parametrize("fmt", DEFINITION_ONLY)
def test_a_format_without_vector_code_keeps_fp32_products_where_others_have_integer_ones(native, fmt):
    """Its integer definition in plain C would be slower than its fp32 kernel."""
    linear, dense = int8_linear(native, fmt)
    assert not linear.integer and int8_linear(native, "q4_k")[0].integer
    x = torch.randn(3, linear.in_features)
    np.testing.assert_allclose(linear(x).double().numpy(), x.double().numpy() @ dense.T, rtol=1e-4, atol=1e-4)


def test_half_precision_weights_keep_fp32_products(native):
    w = torch.randn(16, 64).to(torch.bfloat16)
    linear = QuantLinear(native, "bf16", w)
    assert not linear.integer
    x = torch.randn(2, 64)
    torch.testing.assert_close(linear(x), x @ w.float().T, atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module", params=list(AVX2_TILE_BUILDS))
def avx2_tiles(request):
    """The kernels built for an AVX2-class CPU without AVX-512, with AVX-VNNI (Alder Lake's instruction set)
    and without (Haswell's), where this CPU can run them."""
    march, flags = AVX2_TILE_BUILDS[request.param]
    if not can_run(flags):
        pytest.skip(f"this CPU cannot run the {request.param} build")
    loaded = quant_kernels.kernels_for(march).with_integer_products(True)
    assert (loaded.isa, loaded.integer_isa) == ("avx2", request.param)
    return loaded


@pytest.mark.slow
@pytest.mark.parametrize("fmt", VECTOR)
def test_the_avx2_tiles_give_the_definitions_bits_for_any_rows_and_columns(native, avx2_tiles, fmt):
    """8 columns a vector, a tile in two halves, passes of 4 rows, with vpdpbusd or with vpmaddubsw: the
    definition's bits, the same as the 16-wide tiles', for every pass size and for column ranges that cut
    through a tile's halves."""
    here, _ = int8_linear(native, fmt, rows=40, seed=7, bias=torch.randn(40))
    there = QuantLinear(avx2_tiles, fmt, here.qs, bias=here.bias)
    assert torch.equal(there.tiles, here.tiles)  # the portable packing's bytes (AVX-512's, for Q4_K and Q6_K, here)
    x = torch.randn(7, here.in_features) * 3
    for count in range(1, 8):
        assert torch.equal(bits(there(x[:count])), bits(here(x[:count]))), count
    assert torch.equal(bits(there(x)), bits(defined(there, x) + there.bias))
    assert_column_ranges(there, x, there(x), [(5, 37), (8, 16), (0, 3), (9, 24), (33, 40)])  # within a half, across


# Where each format's quant bits lie in a GGUF block (bytes first..end), and the byte that sets every quant
# there to its largest (Q8_0: +127, stored + 128 as 255; MXFP4: nibble 7, the value 6, +12 as 24; IQ4: nibble
# 15, the level 113, +128 as 241).
QUANT_BYTES = {"q4_0": (2, 18, 0xFF), "q4_1": (4, 20, 0xFF), "q5_0": (2, 22, 0xFF), "q5_1": (4, 24, 0xFF),
               "q8_0": (2, 34, 0x7F), "mxfp4": (1, 17, 0x77), "q4_k": (16, 144, 0xFF), "q5_k": (16, 176, 0xFF),
               "q6_k": (0, 192, 0xFF), "iq4_nl": (2, 18, 0xFF), "iq4_xs": (8, 136, 0xFF), "q3_k": (0, 96, 0xFF)}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", VECTOR)
def test_the_avx2_tiles_sum_the_largest_products_exactly(native, avx2_tiles, fmt):
    """Without AVX-VNNI, vpmaddubsw adds products in pairs into int16 lanes, which then hold several groups'
    pairs before they widen (Q8_0's quants, up to 255, in two parts). Every quant at its largest times
    activations of +-127 of one sign puts every lane at its largest sum: the definition's bits still."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from tests.kquant_blocks import random_blocks

    cols = 512
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt.upper()]]
    raw = random_blocks(fmt.upper(), 16, cols, np.random.default_rng(5), SCALE.get(fmt, 1.0))
    blocks = raw.reshape(16, cols // block, size)
    first, end, largest = QUANT_BYTES[fmt]
    blocks[:, :, first:end] = largest
    qs = torch.from_numpy(blocks.reshape(16, -1).copy())
    here, there = QuantLinear(native, fmt, qs), QuantLinear(avx2_tiles, fmt, qs)
    x = torch.stack([torch.ones(cols), -torch.ones(cols), torch.ones(cols) * 3])
    assert torch.equal(bits(there(x)), bits(defined(there, x)))
    assert torch.equal(bits(there(x)), bits(here(x)))
