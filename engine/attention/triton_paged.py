"""Triton kernels for paged decode attention, split-K ("flash-decoding") style.

Imported only by engine/attention/paged.py, and only once triton is known to
import. With TRITON_INTERPRET=1 set before this module is first imported, the
kernels run in Triton's interpreter on CPU tensors (that is how the tests run
them without a GPU).

Two launches, both of a fixed shape for a given (batch, heads, max_blocks), so
the pair can be captured in a CUDA graph: nothing here reads seq_lens on the
host, and the scratch buffers depend only on shapes.
1. `_split_kernel`, grid (batch, kv_heads, splits): one program takes all query
   heads of one GQA group (the K/V block is loaded once for the whole group)
   over one range of the sequence's blocks, with an fp32 online softmax, and
   writes a normalised partial output and its log-sum-exp. Ranges past the
   sequence's end run no iterations and write the neutral partial (0, -inf).
2. `_combine_kernel`, grid (batch, heads): merges the splits, each weighted by
   exp(lse - max lse), into the output in q's dtype.

Only basic Triton (masked load/store, arange, sum, max, exp, where) is used: the
kernels compile for sm_90 with Triton 3.1, 3.3, 3.5 and 3.9 (checked offline, with
no GPU), and run under the interpreter of 3.3 and later. Scores are a broadcast multiply
and a sum rather than tl.dot: a GQA group is 1-8 heads, below tl.dot's minimum
tile of 16 rows.
"""

# No `from __future__ import annotations`: Triton 3.1's interpreter finds constexpr
# parameters by comparing the annotation object, which that would turn into a string.
import torch
import triton
import triton.language as tl

# Splits: enough programs to fill the GPU when batch * kv_heads is small, but a
# split of fewer than MIN_BLOCKS_PER_SPLIT blocks (256 tokens at block size 16)
# would spend more on the combine than it saves.
MIN_BLOCKS_PER_SPLIT = 16
MAX_SPLITS = 16


def split_warps(group_p: int, head_dim: int) -> int:
    """Warps for _split_kernel: the [GROUP_P, BLOCK_SIZE, HEAD_DIM] products live in registers.

    Chosen from ptxas register counts for sm_90 (not timed on a GPU): with 4 warps a group
    of 8 at head_dim 128 spills; this gives no spills and <= 128 registers a thread for
    every group size at head_dim 64 and groups 3-8 at 128 (groups 1-2 at 128: ~165).
    """
    return min(16, max(4, group_p * head_dim // 64))


def num_splits_for(max_blocks: int) -> int:
    """Number of splits for a block table of `max_blocks` columns (a static shape, never seq_lens)."""
    return max(1, min(MAX_SPLITS, triton.cdiv(max_blocks, MIN_BLOCKS_PER_SPLIT)))


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, part_out_ptr, part_lse_ptr,
                  scale, blocks_per_split, max_blocks, window,
                  stride_qb, stride_qh, stride_qd,
                  stride_kb, stride_kh, stride_kt, stride_kd,
                  stride_vb, stride_vh, stride_vt, stride_vd,
                  stride_tb, stride_tn,
                  stride_pb, stride_ph, stride_ps,
                  stride_lb, stride_lh,
                  GROUP: tl.constexpr, GROUP_P: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    # A sliding-window layer (window > 0) reads positions lo..seq_len-1 only; 0: every position.
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)

    g = tl.arange(0, GROUP_P)  # GROUP padded to a power of two; rows >= GROUP are masked
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    heads = kv_head * GROUP + g
    in_group = g < GROUP
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=in_group[:, None], other=0.0).to(tl.float32) * scale

    m = tl.full([GROUP_P], float("-inf"), tl.float32)  # running max of the scores
    l = tl.zeros([GROUP_P], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([GROUP_P, HEAD_DIM], tl.float32)  # running sum of exp(score - m) * v

    # Only the blocks that hold context are read: the loop bound comes from seq_len,
    # and a range starting past it runs no iterations.
    first = split * blocks_per_split
    # Clamped to the table's width: a seq_len too large for it must not read past the table.
    used_blocks = tl.minimum((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE, max_blocks)
    last = tl.minimum(first + blocks_per_split, used_blocks)
    # Blocks wholly before the window are skipped, so every iteration still holds a valid position.
    first = tl.maximum(first, lo // BLOCK_SIZE)
    k_base = k_ptr + kv_head * stride_kh + t[:, None] * stride_kt + d[None, :] * stride_kd
    v_base = v_ptr + kv_head * stride_vh + t[:, None] * stride_vt + d[None, :] * stride_vd
    for i in range(first, last):
        # int64: block * stride of a large pool overflows int32 (1M elements per block is common)
        block = tl.load(tables_ptr + seq * stride_tb + i * stride_tn).to(tl.int64)
        # The tail of the last block was never written: masked out of the load, so any
        # bits there (NaN included) are never read.
        valid = ((i * BLOCK_SIZE + t) < seq_len) & ((i * BLOCK_SIZE + t) >= lo)
        k = tl.load(k_base + block * stride_kb, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_base + block * stride_vb, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_P, BLOCK_SIZE]
        s = tl.where(valid[None, :], s, float("-inf"))
        # Every iteration has at least one valid position, so m_new is finite
        # and exp(-inf - m_new) is a clean 0.
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    # A split with no context writes out = 0, lse = -inf: zero weight in the combine.
    has_context = l > 0
    l_safe = tl.where(has_context, l, 1.0)
    lse = tl.where(has_context, m + tl.log(l_safe), float("-inf"))
    out = acc / l_safe[:, None]
    tl.store(part_out_ptr + seq * stride_pb + heads[:, None] * stride_ph + split * stride_ps + d[None, :],
             out, mask=in_group[:, None])
    tl.store(part_lse_ptr + seq * stride_lb + heads * stride_lh + split, lse, mask=in_group)


@triton.jit
def _combine_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_splits,
                    stride_pb, stride_ph, stride_ps,
                    stride_lb, stride_lh,
                    stride_ob, stride_oh, stride_od,
                    SPLITS_P: tl.constexpr, HEAD_DIM: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_P)
    d = tl.arange(0, HEAD_DIM)
    in_range = s < num_splits
    lse = tl.load(part_lse_ptr + seq * stride_lb + head * stride_lh + s, mask=in_range, other=float("-inf"))
    top = tl.max(lse, axis=0)
    # All splits empty (seq_len 0, a padding slot of a batch): weights 0, output 0, no NaN.
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp(lse - top)  # [SPLITS_P]
    parts = tl.load(part_out_ptr + seq * stride_pb + head * stride_ph + s[:, None] * stride_ps + d[None, :],
                    mask=in_range[:, None], other=0.0)
    total = tl.sum(weight, axis=0)
    total = tl.where(total > 0, total, 1.0)
    out = tl.sum(weight[:, None] * parts, axis=0) / total
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + d * stride_od, out.to(out_ptr.dtype.element_ty))


def paged_decode_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                        num_splits: int | None = None, window: int | None = None) -> torch.Tensor:
    """Paged decode attention with the Triton kernels; see paged.paged_decode_attention.

    q [B, heads, D]; k_cache/v_cache [num_blocks, kv_heads, block_size, D] (any strides);
    block_tables [B, max_blocks] int32; seq_lens [B] int32 -> [B, heads, D] in q's dtype.
    `num_splits` defaults to num_splits_for(max_blocks); tests pass it to force many splits.
    `window`: a sliding-window layer's width (only the last `window` positions are read).
    """
    batch, heads, dim = q.shape
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    max_blocks = block_tables.shape[1]
    assert dim >= 16 and dim & (dim - 1) == 0, f"head_dim {dim} is not a power of two >= 16"
    assert block_size & (block_size - 1) == 0, f"block_size {block_size} is not a power of two"
    assert heads % kv_heads == 0, f"{heads} heads do not split into {kv_heads} KV heads"
    assert k_cache.shape[-1] == dim and v_cache.shape == k_cache.shape
    group = heads // kv_heads
    splits = num_splits or num_splits_for(max_blocks)
    blocks_per_split = triton.cdiv(max_blocks, splits)

    # Scratch of a fixed shape: allocation never depends on seq_lens (CUDA-graph safe).
    part_out = torch.empty((batch, heads, splits, dim), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((batch, heads, splits), device=q.device, dtype=torch.float32)
    out = torch.empty_like(q)
    group_p = triton.next_power_of_2(group)
    _split_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse,
        scale, blocks_per_split, max_blocks, window or 0,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(),
        *part_out.stride()[:3], *part_lse.stride()[:2],
        GROUP=group, GROUP_P=group_p, BLOCK_SIZE=block_size, HEAD_DIM=dim,
        num_warps=split_warps(group_p, dim))
    _combine_kernel[(batch, heads)](
        part_out, part_lse, out, splits,
        *part_out.stride()[:3], *part_lse.stride()[:2], *out.stride(),
        SPLITS_P=triton.next_power_of_2(splits), HEAD_DIM=dim)
    return out
