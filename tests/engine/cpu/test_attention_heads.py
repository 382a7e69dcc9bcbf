"""A chunk of attention for a group of query heads (csrc/attention.c, kc_attend_chunk): the vector path that
reads each K and V row once for several heads must give, bit for bit, what one head after another gives
(kc_attend_chunk_each_head): a decode step and every multi-token path of the integer products build on
those bits, so a faster attention may not move one."""

import ctypes

import pytest
import torch

from engine.cpu import kernels as quant_kernels


@pytest.fixture(scope="module")
def lib():
    loaded = quant_kernels.load_quant_kernels()
    assert not isinstance(loaded, str), loaded
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    for fn in (loaded.lib.kc_attend_chunk, loaded.lib.kc_attend_chunk_each_head):
        fn.argtypes = [p, p, p, i, i, i, i, f, p, p, i]
        fn.restype = None
    return loaded.lib


def attend(fn, q, k, v, group, dim, t0, t1, scale):
    scores = torch.full((group * (t1 - t0),), float("nan"))
    part = torch.full((group * (dim + 2),), float("nan"))
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), group, dim, t0, t1, scale, scores.data_ptr(), part.data_ptr(),
       int(k.dtype == torch.float16))
    return part


# head sizes: 64 has a path of its own (register-blocked, four keys at a time); the others take the grouped path
@pytest.mark.parametrize("dim", [16, 32, 80, 128, 256])
@pytest.mark.parametrize("group", [1, 3, 6, 8, 12])
def test_heads_read_together_give_the_bits_of_one_head_at_a_time(lib, dim, group):
    gen = torch.Generator().manual_seed(dim * 100 + group)
    positions = 400
    q = torch.randn(group * dim, generator=gen)
    k = torch.randn(positions, dim, generator=gen) * 2
    v = torch.randn(positions, dim, generator=gen)
    for t0, t1 in ((0, 1), (3, 8), (0, 64), (17, 350), (0, 400)):
        together = attend(lib.kc_attend_chunk, q, k, v, group, dim, t0, t1, dim ** -0.5)
        alone = attend(lib.kc_attend_chunk_each_head, q, k, v, group, dim, t0, t1, dim ** -0.5)
        assert not torch.isnan(together).any()
        assert torch.equal(together.view(torch.int32), alone.view(torch.int32)), (t0, t1)


def test_the_result_is_attention_over_the_chunk(lib):
    """Against torch: max, sum of exps and the unnormalised output of each head (up to fp32 rounding)."""
    gen = torch.Generator().manual_seed(1)
    group, dim, t0, t1, scale = 6, 128, 10, 300, 128 ** -0.5
    q, k, v = torch.randn(group, dim, generator=gen), torch.randn(400, dim, generator=gen), torch.randn(400, dim, generator=gen)
    part = attend(lib.kc_attend_chunk, q.flatten().contiguous(), k, v, group, dim, t0, t1, scale).view(group, dim + 2)
    scores = (q.double() @ k[t0:t1].double().T) * scale
    top = scores.max(dim=1).values
    weights = torch.exp(scores - top[:, None])
    torch.testing.assert_close(part[:, 0].double(), top, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part[:, 1].double(), weights.sum(dim=1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(part[:, 2:].double(), weights @ v[t0:t1].double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim", [16, 64, 80, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_fp16_kv_give_the_bits_of_fp32_kv_holding_the_same_values(lib, dim, group):
    """The integer path keeps K/V in fp16 (CausalLM.kv_dtype): widening is exact, so every path of a chunk must
    give what the same values in fp32 give, bit for bit (a decode step and a verify read either's cache alike)."""
    gen = torch.Generator().manual_seed(dim * 10 + group)
    q = torch.randn(group * dim, generator=gen)
    k = (torch.randn(300, dim, generator=gen) * 2).half()
    v = torch.randn(300, dim, generator=gen).half()
    for fn in (lib.kc_attend_chunk, lib.kc_attend_chunk_each_head):
        for t0, t1 in ((0, 1), (5, 9), (0, 64), (13, 300)):
            halves = attend(fn, q, k, v, group, dim, t0, t1, dim ** -0.5)
            widened = attend(fn, q, k.float(), v.float(), group, dim, t0, t1, dim ** -0.5)
            assert not torch.isnan(halves).any()
            assert torch.equal(halves.view(torch.int32), widened.view(torch.int32)), (fn, t0, t1)
