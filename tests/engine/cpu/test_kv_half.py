"""fp16 K/V (the integer path's cache: CausalLM.kv_dtype): the fused C step rounds what it stores exactly as
torch's .to(torch.float16) does, on every build, so a position stored by C and one stored by torch (a
checkpoint imported, the eager path) are the same bits; and an engine on the integer path keeps its pool and
buffers in fp16, one on fp32 products in fp32."""

import ctypes
import shutil

import pytest
import torch

from engine import Engine, EngineOptions
from engine.bench.perf import kv_bytes_per_position
from engine.cpu.decode_step import FusedCPUDecode
from engine.cpu.kernels import kernels_for, load_quant_kernels
from engine.kv.cache import ContiguousKVCache
from engine.weights.checkpoint import load_model
from tests.tiny_gguf import write_gguf
from tests.tiny_models import VOCAB, load_reference, make_tiny_model

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="the fused step is C code built on this machine")


@pytest.fixture(scope="module", ids=["this-cpu", "portable"],
                params=["native", pytest.param("x86-64", marks=pytest.mark.slow)])
def build(request):
    """This CPU's build (F16C, AVX-512 where it has them) and the portable C's own rounding."""
    if request.param == "native":
        loaded = load_quant_kernels()
        assert not isinstance(loaded, str), loaded
        return loaded
    return kernels_for(request.param)


def rounded_by_c(build, values: torch.Tensor) -> torch.Tensor:
    fn = build.lib.kc_round_to_half
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    out = torch.empty(values.numel(), dtype=torch.float16)
    fn(values.data_ptr(), out.data_ptr(), values.numel())
    return out


def test_the_stores_rounding_is_torchs_for_every_kind_of_float(build):
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31, (1 << 20,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, float("inf"), float("-inf"),
                          2.0**-24, 2.0**-25, -2.0**-25, 2.0**-25 * 1.0000001, 1.5 * 2.0**-24, 2.5 * 2.0**-24,
                          2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1e-30])
    # The ties: every fp16 value's midpoint with the next one, the rounding's hardest case.
    grid = torch.arange(0, 0x7BFF, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    ties = (grid[:-1] + grid[1:]) / 2
    values = torch.cat([bits.view(torch.float32), edges, ties, -ties]).contiguous()
    expected = values.to(torch.float16)
    actual = rounded_by_c(build, values)
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(actual[~nan].view(torch.int16), expected[~nan].view(torch.int16))


def test_the_fused_step_stores_fp16_kv_as_torch_rounds_them(build, tmp_path):
    """Layer 0's K/V come from the embeddings alone (no attention before them): the fp16 cache holds torch's
    rounding of what the same step stores in an fp32 cache, for a prompt in one call and token by token."""
    model = load_model(make_tiny_model(tmp_path, "qwen3", seed=7), torch.device("cpu"), torch.float32)
    fused = FusedCPUDecode(model, build)
    cfg = model.cfg
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()

    def stored(dtype, piece):
        cache = ContiguousKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 64, torch.device("cpu"), dtype)
        for first in range(0, len(ids), piece):
            cache.reserve(len(ids[first:first + piece]))
            fused.forward(ids[first:first + piece], cache, 2)
            cache.commit(len(ids[first:first + piece]))
        k, v = cache.positions(0, len(ids))
        return k[0], v[0]

    k32, v32 = stored(torch.float32, len(ids))
    for piece in (len(ids), 1):
        k16, v16 = stored(torch.float16, piece)
        assert k16.dtype == v16.dtype == torch.float16
        assert torch.equal(k16.view(torch.int16), k32.to(torch.float16).view(torch.int16))
        assert torch.equal(v16.view(torch.int16), v32.to(torch.float16).view(torch.int16))


def test_an_engine_on_integer_products_keeps_fp16_kv_and_one_on_fp32_products_fp32(tmp_path):
    gguf = write_gguf(load_reference(make_tiny_model(tmp_path / "hf", "llama", seed=4)), tmp_path / "q4.gguf",
                      quant="Q4_1")
    integer = Engine.load(EngineOptions(model=str(gguf), device="cpu", kv_cache_gb=0.01))
    exact = Engine.load(EngineOptions(model=str(gguf), device="cpu", kv_cache_gb=0.01, exact_fp32=True))
    assert integer.runner.fused is not None and integer.runner.fused.integer
    assert integer.prefix_cache.pool.data.dtype == integer.runner._new_buffer().storage()[0].dtype == torch.float16
    assert exact.prefix_cache.pool.data.dtype == exact.runner._new_buffer().storage()[0].dtype == torch.float32
    # The same --kv-cache-gb holds twice the tokens, and K/V stored under one are never read as the other's.
    assert integer.prefix_cache.pool.num_blocks // 2 == exact.prefix_cache.pool.num_blocks
    assert integer.fingerprint != exact.fingerprint
    # What is said of it (ask --json, the bench, serve's banner), and what a decode step reads per position.
    assert (integer.info.kv_dtype, exact.info.kv_dtype) == ("float16", "float32")
    assert kv_bytes_per_position(integer) * 2 == kv_bytes_per_position(exact)
