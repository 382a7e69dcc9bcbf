"""Paged decode attention: one new query token per sequence over K/V kept in KVPool blocks.

Each sequence's context lives in the pool blocks its block table lists, in
order; attention reads them in place instead of gathering a contiguous copy
every step. Two implementations with one signature:
- the Triton kernels (engine/attention/triton_paged.py), on CUDA tensors, or on
  CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, for tests);
- `paged_decode_reference` in plain torch, the fallback everywhere else, and what a layer with attention
  sinks (gpt-oss) runs on a GPU too: the Triton kernels do not read sinks.
Both have static shapes and no host synchronisation, so either can sit inside
a torch.compile'd or CUDA-graph-captured decode step.

Layout, for layer l of a KVPool: k_cache = pool.data[:, 0, l] and
v_cache = pool.data[:, 1, l], each [num_blocks, kv_heads, block_size, head_dim]
and strided (never made contiguous: that would copy the whole pool).
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _triton_importable() -> bool:
    # Guarded and lazy: triton is optional (absent on macOS, on CPU-only installs).
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _use_triton(q: torch.Tensor) -> bool:
    return (q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") and _triton_importable()


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one new token per sequence over its paged context.

    q: [B, heads, head_dim], the new tokens' queries.
    k_cache, v_cache: [num_blocks, kv_heads, block_size, head_dim], any strides.
    block_tables: [B, max_blocks] int32; row b lists sequence b's blocks in order.
        Entries past the blocks a sequence uses are never read by the kernel,
        but must be valid block indices (the reference gathers them), e.g. 0.
    seq_lens: [B] int32, tokens of context including the new token (whose K/V
        is already in the pool). 0 marks a padding slot: its output is 0.
    scale: multiplies q.k, usually head_dim ** -0.5.
    window: a sliding-window layer's width (Gemma 3): only the last `window` positions are read.
    sinks: [heads], a sink logit per query head that joins each softmax and attends to nothing (gpt-oss).
    Returns [B, heads, head_dim] in q's dtype, accumulated in fp32. Query head h
    reads KV head h // (heads // kv_heads) (GQA).
    """
    if _use_triton(q) and sinks is None:
        from engine.attention.triton_paged import paged_decode_triton

        return paged_decode_triton(q, k_cache, v_cache, block_tables, seq_lens, scale, window=window)
    return paged_decode_reference(q, k_cache, v_cache, block_tables, seq_lens, scale, window, sinks)


def paged_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch paged_decode_attention (same arguments, same result).

    Gathers all max_blocks blocks of every row and masks positions >= seq_len,
    so shapes never depend on seq_lens: no .item(), no data-dependent branch,
    usable under torch.compile and CUDA graph capture. It reads the whole
    block table rather than only the used blocks, so on a GPU the Triton
    kernel is the fast path.
    """
    batch, heads, dim = q.shape
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    context = block_tables.shape[1] * block_size
    index = block_tables.long()

    def gather(cache: torch.Tensor) -> torch.Tensor:
        # [B, max_blocks, kv_heads, block_size, D] -> [B, kv_heads, context, D], fp32
        blocks = cache[index].transpose(1, 2)
        return blocks.reshape(batch, kv_heads, context, dim).float()

    k, v = gather(k_cache), gather(v_cache)
    positions = torch.arange(context, device=q.device)[None, :]
    valid = positions < seq_lens[:, None].long()  # [B, context]
    if window is not None:
        valid &= positions >= seq_lens[:, None].long() - window
    # Unwritten positions (the last block's tail, blocks past the end) may hold NaN bits
    # (the pool is torch.empty): zero V there, because 0 * NaN is NaN even with weight 0.
    # In place: the gather made v a fresh tensor.
    v.masked_fill_(~valid[:, None, :, None], 0.0)

    # A GQA group's query heads become rows of one matmul against their shared KV head.
    queries = q.float().reshape(batch, kv_heads, group, dim) * scale
    scores = queries @ k.transpose(-1, -2)  # [B, kv_heads, group, context]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    if sinks is not None:  # the sink joins the softmax's maximum and its total, and adds nothing to the output
        sink = sinks.float().view(1, kv_heads, group, 1)
        top = torch.maximum(top, sink)
    top = torch.where(top == float("-inf"), 0.0, top)  # seq_len 0: all -inf; weights 0, output 0
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sink - top)
    total = total.clamp_min(torch.finfo(torch.float32).tiny)
    out = (weights @ v) / total
    return out.reshape(batch, heads, dim).to(q.dtype)
