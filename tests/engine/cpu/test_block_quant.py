"""The CPU block kernels: exact weights, matvec == dense matmul up to summation order, fallbacks."""

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import Engine, EngineError, EngineOptions, SamplingParams
from engine.cpu import kernels as quant_kernels
from engine.cpu.linear import QuantLinear
from engine.weights.checkpoint import load_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the block kernels need a C compiler")


@pytest.fixture(scope="module")
def kernels():
    loaded = quant_kernels.load_quant_kernels()
    assert not isinstance(loaded, str), loaded
    return loaded


def quantized(fmt, rows, cols, seed=0):
    """(GGUF's raw blocks [rows, bytes], the dense fp32 weight gguf's own dequantizer gives)."""
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = quantize(w, qtype)
    return torch.from_numpy(raw), torch.from_numpy(dequantize(raw, qtype))


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "mxfp4"])
def test_dequantized_weights_are_bit_identical_to_ggufs_own_dequantizer(kernels, fmt):
    qs, dense = quantized(fmt, 77, 96)
    linear = QuantLinear(kernels, fmt, qs)
    assert torch.equal(linear.dequantized(), dense)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "mxfp4"])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 23, 128, 129, 300])
def test_products_match_a_dense_matmul_of_the_same_weights(kernels, fmt, rows):
    qs, dense = quantized(fmt, 130, 160, seed=rows)
    bias = torch.randn(130)
    linear = QuantLinear(kernels, fmt, qs, bias)
    x = torch.randn(rows, 160)
    torch.testing.assert_close(linear(x), F.linear(x, dense, bias), atol=1e-4, rtol=1e-5)


def test_leading_dimensions_are_kept(kernels):
    qs, dense = quantized("q4_1", 64, 64)
    linear = QuantLinear(kernels, "q4_1", qs)
    x = torch.randn(2, 3, 64)
    assert linear(x).shape == (2, 3, 64)
    torch.testing.assert_close(linear(x), x @ dense.T, atol=1e-4, rtol=1e-5)


def fused_weight(module):
    """The fp32 weight a (Mixed)QuantLinear runs, its parts stacked."""
    parts = getattr(module, "parts", [module])
    return torch.cat([part.dequantized().clone() for part in parts])


def test_the_block_linears_rebuild_the_dense_weights_exactly(kernels, q4_gguf_model):
    cpu = torch.device("cpu")
    packed = load_model(q4_gguf_model, cpu, torch.float32, kernels)
    dense = load_model(q4_gguf_model, cpu, torch.float32)
    attn, dense_attn = packed.layers[0].self_attn, dense.layers[0].self_attn
    for ours, theirs in [(attn.qkv_proj, dense_attn.qkv_proj), (attn.o_proj, dense_attn.o_proj),
                         (packed.layers[1].mlp.gate_up_proj, dense.layers[1].mlp.gate_up_proj),
                         (packed.lm_head, dense.lm_head)]:
        assert torch.equal(fused_weight(ours), theirs.weight)  # q/k rows un-permuted like the dense ones
    everything = torch.arange(packed.cfg.vocab_size)
    assert torch.equal(packed.embed_tokens(everything), dense.embed_tokens.weight)


def test_block_weights_give_the_dense_models_logits_and_greedy_tokens(kernels, q4_gguf_model):
    packed = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", exact_fp32=True))
    dense = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", weights="dense"))
    assert packed.info.weights.startswith("q4_1 blocks") and dense.info.weights == "dense"
    ids = list(range(60, 100))
    for rows in (list(range(200)), ids, ids[:5]):  # the dequantize+GEMM path and the kernel
        torch.testing.assert_close(packed.runner.logits(rows, all_logits=True),
                                   dense.runner.logits(rows, all_logits=True), atol=1e-4, rtol=1e-5)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert list(packed.generate(ids, params))[-1].token_ids == list(dense.generate(ids, params))[-1].token_ids


def test_without_a_compiler_the_engine_falls_back_to_dense_weights(q4_gguf_model, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(quant_kernels.shutil, "which", lambda name: None)
    monkeypatch.setattr(quant_kernels, "_loaded", None)  # as in a new process; the loaded kernels come back after
    engine = Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32"))
    assert engine.info.weights == "dense"
    with pytest.raises(EngineError, match="no C compiler"):
        Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="float32", weights="blocks"))


def test_block_weights_are_refused_outside_cpu_float32(q4_gguf_model):
    with pytest.raises(EngineError, match="float32 only"):
        Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="bfloat16", weights="blocks"))
    assert Engine.load(EngineOptions(model=str(q4_gguf_model), dtype="bfloat16")).info.weights == "dense"


def test_a_model_without_blocks_loads_dense_weights(tiny_engine):
    assert tiny_engine.info.weights == "dense"


def test_wide_matrices_are_multiplied_in_row_slices_with_the_same_result(kernels):
    from engine.cpu.linear import GEMM_ROWS, KERNEL_MAX_ROWS

    qs, dense = quantized("q4_1", 2 * GEMM_ROWS + 37, 64, seed=11)
    linear = QuantLinear(kernels, "q4_1", qs)
    x = torch.randn(KERNEL_MAX_ROWS + 20, 64)
    torch.testing.assert_close(linear(x), x @ dense.T, atol=1e-4, rtol=1e-5)
    assert torch.equal(linear.dequantized(GEMM_ROWS, 37), dense[GEMM_ROWS : GEMM_ROWS + 37])
