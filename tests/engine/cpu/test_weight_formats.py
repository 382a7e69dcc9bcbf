"""Every kernel format beyond Q4_1/Q8_0 (GGUF's Q4_0/Q5_0/Q5_1, MXFP4, the K-quants, IQ4_NL/IQ4_XS, bf16, f16), on
every ISA path: weights bit-identical to gguf's own dequantizer, products equal to a dense matmul up to summation
order."""

import ctypes
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.cpu import kernels as quant_kernels
from engine.cpu.formats import RAW_BLOCKS
from engine.cpu.kernels import LinearDesc
from engine.cpu.linear import QuantLinear
from engine.cpu.mixed_linear import MixedQuantLinear
from tests.cpu_builds import can_run
from tests.kquant_blocks import MXFP4_SUBNORMAL, finite_halves, mxfp4_blocks, random_blocks

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")

FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
           "bf16", "f16"]
# fp16 scales small enough that weights stay about 1 (products then compare at atol 1e-4); MXFP4's is its
# blocks' largest |weight| (tests/kquant_blocks.py)
PRODUCT_SCALE = {"q4_0": 0.1, "q4_1": 0.05, "q8_0": 0.005, "q5_0": 0.05, "q5_1": 0.03, "q2_k": 0.02, "q3_k": 0.005, "q4_k": 1e-3,
                 "q5_k": 5e-4, "q6_k": 2.5e-4, "mxfp4": 1.0, "iq4_nl": 0.01, "iq4_xs": 3e-4}
# ISA -> (gcc -march for it, the CPU flags it needs)
ISAS = {"native": (None, ()), "avx2": ("haswell", ("avx2", "fma", "f16c")), "portable": ("x86-64", ())}


@pytest.fixture(scope="module", params=list(ISAS))
def kernels(request):
    march, flags = ISAS[request.param]
    if march is None:
        loaded = quant_kernels.load_quant_kernels()
        assert not isinstance(loaded, str), loaded
        return loaded
    if not can_run(flags):
        pytest.skip(f"this CPU cannot run the {request.param} path")
    loaded = quant_kernels.kernels_for(march)
    assert loaded.isa == request.param
    return loaded


def half_bits(fmt, rows, cols, rng, any_finite):
    """uint16 bf16/f16 weights: any finite bit pattern (subnormals, huge), or about N(0, 1)."""
    if fmt == "f16":
        return (finite_halves(rng, (rows, cols)) if any_finite else
                rng.standard_normal((rows, cols)).astype(np.float16)).view(np.uint16)
    if not any_finite:
        return (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    pattern = rng.integers(0, 1 << 16, (rows, cols), dtype=np.uint16)
    pattern[(pattern & 0x7F80) == 0x7F80] &= 0xBFFF  # exponent all ones (inf, nan) -> a finite one
    return pattern


def stored(fmt, rows, cols, rng, scale=None):
    """(QuantLinear's qs, gguf.quants.dequantize of the same bytes as fp32). scale None: any valid bytes;
    else fp16 scales within +-scale (MXFP4: blocks' largest |weight| about scale; bf16/f16: weights about
    N(0, 1))."""
    import gguf
    from gguf.quants import dequantize

    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    if fmt in ("bf16", "f16"):
        raw = half_bits(fmt, rows, cols, rng, any_finite=scale is None)
        dense = dequantize(raw.view(np.float16) if fmt == "f16" else raw.view(np.uint8), qtype)
        qs = torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16 if fmt == "bf16" else torch.float16)
        return qs, torch.from_numpy(np.array(dense, dtype=np.float32))
    raw = random_blocks(fmt.upper(), rows, cols, rng, scale)
    with np.errstate(over="ignore"):  # MXFP4 exponents from 253 on make +-12 * scale infinite, in the kernel too
        return torch.from_numpy(raw), torch.from_numpy(dequantize(raw, qtype))


def bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantized_weights_are_bit_identical_to_ggufs_dequantizer_for_any_valid_bytes(kernels, fmt):
    qs, dense = stored(fmt, 37, 512, np.random.default_rng(1))
    linear = QuantLinear(kernels, fmt, qs)
    assert torch.equal(bits(linear.dequantized()), bits(dense))  # every bit, signed zeros and subnormals too
    assert torch.equal(bits(linear.dequantized(5, 20)), bits(dense[5:25]))


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "bf16", "f16"])
def test_weights_quantized_by_gguf_come_back_as_ggufs_dequantizer_gives_them(kernels, fmt):
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    w = np.random.default_rng(2).standard_normal((40, 256)).astype(np.float32)
    raw = quantize(w, qtype)
    qs = {"bf16": lambda: torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16),
          "f16": lambda: torch.from_numpy(raw.copy())}.get(fmt, lambda: torch.from_numpy(raw))()
    assert torch.equal(QuantLinear(kernels, fmt, qs).dequantized(), torch.from_numpy(dequantize(raw, qtype)))


def test_mxfp4_weights_at_every_exponent_gguf_quantizes_to_come_back_bit_for_bit(kernels):
    """E8M0 exponents 0 and 1 (the subnormal scales 2^-128, 2^-127: ggml's other branch) up to 252, the
    largest a finite fp32 value quantizes to (its +-12 * 2^124 still finite), each in several blocks."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(8)
    exponents = rng.permutation(np.resize(np.arange(MXFP4_SUBNORMAL[0], 128), 40 * 16))
    raw = mxfp4_blocks(40, 512, rng, exponents)
    assert set(raw.reshape(-1, 17)[:, 0]) == set(range(253))
    dense = torch.from_numpy(dequantize(raw, GGMLQuantizationType.MXFP4))
    assert torch.isfinite(dense).all()
    assert (dense[dense != 0].abs() < torch.finfo(torch.float32).tiny).any()  # subnormal weights too
    assert torch.equal(bits(QuantLinear(kernels, "mxfp4", torch.from_numpy(raw)).dequantized()), bits(dense))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 8, 9, 48, 60])
def test_products_match_a_dense_matmul_of_the_same_weights(kernels, fmt, rows):
    rng = np.random.default_rng(rows)
    qs, dense = stored(fmt, 70, 512, rng, scale=PRODUCT_SCALE.get(fmt, 1.0))
    bias = torch.randn(70)
    linear = QuantLinear(kernels, fmt, qs, bias=bias)
    x = torch.randn(rows, 512)
    torch.testing.assert_close(linear(x), F.linear(x, dense, bias), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_input_row_gives_the_bits_that_row_gets_among_several(kernels, fmt):
    """Decode's one-row loops (some formats walk their blocks their own way there) sum each column in the
    order, and from the same weights, as the loops over several rows (two to six rows take columns in
    pairs; 71 columns leave one over): a speculative step's verified tokens get a plain step's logits."""
    qs, _ = stored(fmt, 71, 512, np.random.default_rng(4), scale=PRODUCT_SCALE.get(fmt, 1.0))
    linear = QuantLinear(kernels, fmt, qs, bias=torch.randn(71))
    for rows in (2, 3, 4, 5, 6, 7, 9):
        x = torch.randn(rows, 512)
        together = bits(linear(x))
        for r in range(rows):
            assert torch.equal(bits(linear(x[r:r + 1])), together[r:r + 1]), f"row {r} of {rows}"


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k", "q5_0", "mxfp4", "bf16"])
def test_a_column_range_computed_on_one_thread_is_that_slice_of_the_product(kernels, fmt):
    """kc_linear_columns, the call the fused decode step makes per linear, writes y[r * ldy + n]."""
    lib = kernels.lib
    lib.kc_linear_columns.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_int]
    qs, dense = stored(fmt, 50, 256, np.random.default_rng(3), scale=PRODUCT_SCALE.get(fmt, 1.0))
    bias = torch.randn(50)
    linear = QuantLinear(kernels, fmt, qs, bias=bias)
    desc = linear.kernel_desc()
    for rows in (1, 3):
        x, y = torch.randn(rows, 256), torch.full((rows, 64), -7.0)
        lib.kc_linear_columns(ctypes.byref(desc), x.data_ptr(), rows, y.data_ptr(), 64, 11, 43)
        torch.testing.assert_close(y[:, 11:43], F.linear(x, dense, bias)[:, 11:43], atol=1e-4, rtol=1e-5)
        assert (y[:, :11] == -7).all() and (y[:, 43:] == -7).all()


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "mxfp4", "iq4_nl", "iq4_xs", "bf16", "f16"])
def test_weights_stay_as_compact_as_their_format(kernels, fmt):
    qs, _ = stored(fmt, 16, 512, np.random.default_rng(4))
    linear = QuantLinear(kernels, fmt, qs)
    weights, size = RAW_BLOCKS.get(fmt, (1, 2))
    held = sum(t.numel() * t.element_size() for t in linear.buffers())
    assert held == 16 * 512 * size // weights  # Q4_K: 4.5 bits a weight, Q6_K: 6.5625, MXFP4: 4.25, IQ4_XS: 4.25


def test_half_precision_weights_survive_a_model_wide_dtype_change(kernels):
    qs, dense = stored("bf16", 8, 64, np.random.default_rng(7), scale=1.0)
    linear = QuantLinear(kernels, "bf16", qs).to(torch.float32)
    assert torch.equal(linear.dequantized(), dense)


def test_a_fused_linear_of_parts_in_different_formats_gives_each_parts_columns(kernels):
    rng = np.random.default_rng(5)
    parts, dense = [], []
    for fmt, n in (("q4_k", 40), ("q6_k", 24), ("q5_0", 33)):
        qs, w = stored(fmt, n, 256, rng, scale=PRODUCT_SCALE[fmt])
        parts.append(QuantLinear(kernels, fmt, qs, bias=torch.randn(n)))
        dense.append(w)
    mixed = MixedQuantLinear(parts)
    bias = torch.cat([p.bias for p in parts])
    assert [first for _, first in mixed.kernel_descs()] == [0, 40, 64] and mixed.out_features == 97
    assert [d.format for d, _ in mixed.kernel_descs()] == [p.kernel_desc().format for p in parts]
    for rows in (1, 5, 60):  # the kernel over every part's columns at once, and each part's GEMM
        x = torch.randn(rows, 256)
        assert torch.equal(mixed(x), torch.cat([p(x) for p in parts], dim=1))
        torch.testing.assert_close(mixed(x), F.linear(x, torch.cat(dense), bias), atol=1e-4, rtol=1e-5)


def test_a_single_format_linear_describes_itself_as_one_part_at_column_zero(kernels):
    qs, _ = stored("q4_k", 8, 256, np.random.default_rng(6))
    linear = QuantLinear(kernels, "q4_k", qs)
    (desc, first), = linear.kernel_descs()
    assert first == 0 and desc.format == quant_kernels.FORMAT_CODES["q4_k"] and (desc.N, desc.K) == (8, 256)
    assert desc.q == qs.data_ptr()
    # fp32 products read the blocks alone; integer ones also the tiles repacked from them
    assert desc.tiles == (linear.tiles.data_ptr() if linear.tiles is not None else None)
