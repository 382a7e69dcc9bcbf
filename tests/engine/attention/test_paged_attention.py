"""Paged decode attention against dense SDPA over the same context gathered by KVPool.read_into.

The torch reference is tested in this process. The Triton kernels are tested
under Triton's interpreter on CPU tensors, in a child pytest process of this
same file: TRITON_INTERPRET=1 must be set before triton is first imported,
and setting it here would also route every other test's paged attention
through the (slow) interpreter.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version

from engine.attention.paged import paged_decode_attention, paged_decode_reference
from engine.kv.pool import KVPool

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 16
LAYERS, LAYER = 3, 1  # a middle layer: its K/V view is strided in every dimension but the last
# 1 token, either side of a block boundary, and long contexts crossing many blocks
LENS = [1, BLOCK - 1, BLOCK, BLOCK + 1, 5 * BLOCK + 5, 13 * BLOCK]
SHORT_LENS = LENS[:-1]  # for the slow interpreter: 9 table columns
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@dataclass
class Case:
    q: torch.Tensor  # [B, heads, D]
    pool: KVPool
    tables: torch.Tensor  # [B, max_blocks] int32
    lens: torch.Tensor  # [B] int32
    blocks: list[list[int]]  # each sequence's used blocks
    scale: float

    def args(self):
        data = self.pool.data
        return self.q, data[:, 0, LAYER], data[:, 1, LAYER], self.tables, self.lens, self.scale


def make_case(group: int, head_dim: int, dtype: torch.dtype, lens=LENS, kv_heads: int = 2,
              seed: int = 0) -> Case:
    """Sequences in shuffled blocks of one pool; table entries past a sequence's end are random."""
    gen = torch.Generator().manual_seed(seed)
    used = [math.ceil(n / BLOCK) for n in lens]
    num_blocks = sum(used) + 4  # spare blocks no sequence uses
    max_blocks = max(used) + 3  # columns past every sequence's end
    pool = KVPool(num_blocks, BLOCK, LAYERS, kv_heads, head_dim, torch.device("cpu"), dtype)
    pool.data.copy_(torch.randn(pool.data.shape, generator=gen))
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.randint(0, num_blocks, (len(lens), max_blocks), generator=gen, dtype=torch.int32)
    blocks = []
    for row, count in enumerate(used):
        blocks.append(order[:count])
        order = order[count:]
        tables[row, :count] = torch.tensor(blocks[-1], dtype=torch.int32)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen).to(dtype)
    return Case(q, pool, tables, torch.tensor(lens, dtype=torch.int32), blocks, head_dim ** -0.5)


def dense_expected(case: Case) -> torch.Tensor:
    """fp64 SDPA per sequence over K/V copied out of the pool with KVPool.read_into."""
    _, heads, dim = case.q.shape
    kv_heads = case.pool.data.shape[3]
    outs = []
    for row, n in enumerate(case.lens.tolist()):
        k = torch.empty(LAYERS, kv_heads, n, dim, dtype=case.q.dtype)
        v = torch.empty_like(k)
        case.pool.read_into(case.blocks[row], 0, n, k, v)
        k = k[LAYER].double().repeat_interleave(heads // kv_heads, dim=0)
        v = v[LAYER].double().repeat_interleave(heads // kv_heads, dim=0)
        out = F.scaled_dot_product_attention(case.q[row].double()[:, None], k, v, scale=case.scale)
        outs.append(out[:, 0])
    return torch.stack(outs)


def spoil_unused(case: Case, seed: int = 1) -> Case:
    """The same case with NaN/inf in every position no sequence uses and new random table padding."""
    gen = torch.Generator().manual_seed(seed)
    data = case.pool.data
    garbage = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e4], dtype=data.dtype)
    used = torch.zeros(data.shape[0], BLOCK, dtype=torch.bool)  # [block, position]
    for row, n in enumerate(case.lens.tolist()):
        for i, block in enumerate(case.blocks[row]):
            used[block, : min(BLOCK, n - i * BLOCK)] = True
    noise = garbage[torch.randint(0, 4, data.shape, generator=gen)]
    spoiled = torch.where(used[:, None, None, None, :, None], data, noise)
    pool = KVPool(data.shape[0], BLOCK, LAYERS, data.shape[3], data.shape[5], torch.device("cpu"), data.dtype)
    pool.data.copy_(spoiled)
    tables = torch.randint(0, data.shape[0], case.tables.shape, generator=gen, dtype=torch.int32)
    for row, blocks in enumerate(case.blocks):
        tables[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    assert not torch.equal(tables, case.tables)
    return Case(case.q, pool, tables, case.lens, case.blocks, case.scale)


def check_matches_dense(attention, group: int, head_dim: int, dtype: torch.dtype, lens=LENS,
                        **kwargs) -> None:
    case = make_case(group, head_dim, dtype, lens)
    out = attention(*case.args(), **kwargs)
    assert out.shape == case.q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_expected(case), **TOLERANCE[dtype])


def check_ignores_unused(attention, lens=LENS, **kwargs) -> None:
    case = make_case(group=3, head_dim=64, dtype=torch.float32, lens=lens)
    clean = attention(*case.args(), **kwargs)
    spoiled = attention(*spoil_unused(case).args(), **kwargs)
    assert torch.equal(clean, spoiled)


def check_window(attention, lens=LENS, window=BLOCK + 3, **kwargs) -> None:
    """A sliding-window layer's decode token: dense SDPA over the last `window` positions only (a window
    inside one block, crossing blocks, and wider than the shorter sequences)."""
    case = make_case(group=3, head_dim=64, dtype=torch.float32, lens=lens, seed=3)
    out = attention(*case.args(), window=window, **kwargs)
    _, heads, dim = case.q.shape
    kv_heads = case.pool.data.shape[3]
    for row, n in enumerate(case.lens.tolist()):
        k = torch.empty(LAYERS, kv_heads, n, dim)
        v = torch.empty_like(k)
        case.pool.read_into(case.blocks[row], 0, n, k, v)
        start = max(0, n - window)
        k = k[LAYER, :, start:].double().repeat_interleave(heads // kv_heads, dim=0)
        v = v[LAYER, :, start:].double().repeat_interleave(heads // kv_heads, dim=0)
        expected = F.scaled_dot_product_attention(case.q[row].double()[:, None], k, v, scale=case.scale)[:, 0]
        torch.testing.assert_close(out[row].double(), expected, **TOLERANCE[torch.float32])


def check_padding_slot(attention) -> None:
    """seq_len 0 (a padded batch slot) gives 0, not NaN, and leaves the other rows alone."""
    case = make_case(group=4, head_dim=64, dtype=torch.float32, lens=[BLOCK + 1, 2 * BLOCK])
    case.lens[0] = 0
    out = attention(*case.args())
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1].double(), dense_expected(case)[1], **TOLERANCE[torch.float32])


if not INTERPRETING:

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("head_dim", [64, 128])
    @pytest.mark.parametrize("group", [1, 3, 4, 8])
    def test_reference_matches_dense(group, head_dim, dtype):
        check_matches_dense(paged_decode_reference, group, head_dim, dtype)

    def test_reference_ignores_unused_blocks_and_positions():
        check_ignores_unused(paged_decode_reference)

    def test_reference_padding_slot():
        check_padding_slot(paged_decode_reference)

    def test_reference_traces_in_one_graph():
        """No graph break (no .item(), no data-dependent branch); the eager backend keeps it quick."""
        case = make_case(group=3, head_dim=64, dtype=torch.float32)
        compiled = torch.compile(paged_decode_reference, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(*case.args()), paged_decode_reference(*case.args()))

    @pytest.mark.parametrize("window", [3, BLOCK + 3, 4 * BLOCK])
    def test_reference_with_a_window_reads_only_its_last_positions(window):
        check_window(paged_decode_reference, window=window)

    def test_cpu_dispatch_uses_reference(monkeypatch):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        case = make_case(group=3, head_dim=64, dtype=torch.float32)
        assert torch.equal(paged_decode_attention(*case.args()), paged_decode_reference(*case.args()))

    @pytest.mark.slow  # a child pytest under Triton's interpreter
    def test_triton_kernel_under_interpreter():
        """Runs the interpreted_* tests below in a child pytest with TRITON_INTERPRET=1."""
        triton = pytest.importorskip("triton")
        if Version(triton.__version__) < Version("3.7") and Version(np.__version__) >= Version("2.4"):
            pytest.skip("Triton < 3.7's interpreter fails with NumPy >= 2.4 (int() of a 1-element array)")
        env = dict(os.environ, TRITON_INTERPRET="1")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", "interpreted"],
            env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]

else:
    from engine.attention.triton_paged import paged_decode_triton

    # The interpreter is slow: a few cases, 5 sequences x 2 KV heads each, covering groups 1-8
    # (3: not a power of two), both head sizes and dtypes, and split counts over the 9 table
    # columns: 1; 3 of 3 blocks; 8 of 2 blocks, where the short sequences leave most splits
    # empty and the last 3 lie past the table (neutral partials); None: num_splits_for(9) = 1.
    @pytest.mark.parametrize(("group", "head_dim", "dtype", "splits"), [
        (1, 64, torch.float32, 8), (3, 64, torch.float32, 3), (4, 128, torch.float32, None),
        (3, 128, torch.bfloat16, 8), (8, 64, torch.bfloat16, 1),
    ])
    def test_interpreted_kernel_matches_dense(group, head_dim, dtype, splits):
        check_matches_dense(paged_decode_triton, group, head_dim, dtype, SHORT_LENS, num_splits=splits)

    def test_interpreted_kernel_ignores_unused_blocks_and_positions():
        check_ignores_unused(paged_decode_triton, SHORT_LENS, num_splits=4)

    @pytest.mark.parametrize(("window", "splits"), [(3, 4), (BLOCK + 3, 1), (2 * BLOCK, 8)])
    def test_interpreted_kernel_with_a_window(window, splits):
        check_window(paged_decode_triton, SHORT_LENS, window=window, num_splits=splits)

    def test_interpreted_kernel_padding_slot():
        check_padding_slot(paged_decode_triton)

    def test_interpreted_dispatch_uses_kernel():
        case = make_case(group=3, head_dim=64, dtype=torch.float32, lens=[1, 3 * BLOCK + 1])
        assert torch.equal(paged_decode_attention(*case.args()), paged_decode_triton(*case.args()))
