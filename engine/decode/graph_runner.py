"""DecodeRunner: the decode step of a paged sequence as a static function, replayed per token.

At batch 1 a decode step is a few hundred small kernels; launched one by one
from Python, the GPU waits on the launches (launch-bound). The step here takes
only device tensors (token, position, block table), whose shapes never change
for a given table width, so it can be captured once in a CUDA graph (one
launch per token) or compiled by torch.compile, and replayed at every
position of every sequence.

Block tables come in power-of-two widths (buckets, at least MIN_TABLE_BLOCKS),
each with its own static table and, with CUDA graphs, its own graph, captured
the first time a sequence needs that width. Paged decode attention reads only
the blocks below the sequence's length, so a wide table costs little.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.kv.paged import attend_in_place
from engine.kv.pool import KVPool
from engine.kv.prefix_cache import PrefixCache
from engine.model.causal_lm import CausalLM

MIN_TABLE_BLOCKS = 64  # 1k tokens at 16 per block
WARMUP_STEPS = 2  # before a capture: lazy initialisation (cuBLAS handles, Triton compiles) must not be captured


class PagedDecodeKV:
    """A decode step's view of B sequences' blocks (B = 1 for a captured step): tensors only, so the step
    can be captured.

    `table` [B, width] int32 lists each sequence's blocks; `position` [B] long is each new token's
    position. Sequence b's K/V go to (table[b, position[b] // block_size], position[b] % block_size)."""

    def __init__(self, pool: KVPool, table: torch.Tensor, position: torch.Tensor):
        self.pool, self.table = pool, table
        size = pool.block_size
        self.blocks = table.gather(1, (position // size).unsqueeze(1)).squeeze(1).long()
        self.offsets = position % size
        self.seq_len = (position + 1).to(torch.int32)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        return attend_in_place(self.pool, layer, q, k, v, self.blocks, self.offsets, self.table, self.seq_len, scale)


@dataclass
class _Bucket:
    table: torch.Tensor  # [1, width] int32, static
    blocks: list[int] = field(default_factory=list)  # what table[0, :len(blocks)] holds now
    graph: "torch.cuda.CUDAGraph | None" = None
    logits: torch.Tensor | None = None  # the graph's output buffer


class DecodeRunner:
    def __init__(self, model: CausalLM, cache: PrefixCache, cuda_graphs: bool, compile: bool):
        device = model.embed_tokens.weight.device
        if cuda_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.pool, self.cuda_graphs = model, cache.pool, cuda_graphs
        self.device = device
        # Warm-up and capture write K/V somewhere: a block of its own, never handed to a sequence.
        self.scratch_block = cache.reserve_block()
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self._buckets: dict[int, _Bucket] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        # dynamic=False: one specialised graph per table width, like the CUDA graphs; fullgraph: a step
        # that falls back to Python midway would bring the launch overhead back, so it is an error.
        self._step = (torch.compile(self._eager_step, dynamic=False, fullgraph=True)
                      if compile else self._eager_step)

    def _eager_step(self, table: torch.Tensor) -> torch.Tensor:
        return self.model.decode_step(self.token, self.position, PagedDecodeKV(self.pool, table, self.position))

    @staticmethod
    def table_width(num_blocks: int) -> int:
        return max(MIN_TABLE_BLOCKS, 1 << (num_blocks - 1).bit_length())

    def step(self, token: int, position: int, blocks: list[int]) -> torch.Tensor:
        """Logits [1, vocab] of `token` at `position`, its K/V written into `blocks` (which must
        already cover position). The result may be a static buffer: read it before the next step."""
        bucket = self._bucket(self.table_width(len(blocks)))
        if bucket.blocks != blocks:  # a new block, a new sequence, or a block swapped by deduplication
            bucket.table[0, : len(blocks)].copy_(torch.tensor(blocks, dtype=torch.int32), non_blocking=True)
            bucket.blocks = list(blocks)
        self.token.fill_(token)
        self.position.fill_(position)
        if bucket.graph is not None:
            bucket.graph.replay()
            return bucket.logits
        return self._step(bucket.table)

    def step_batch(self, tokens: list[int], positions: list[int], blocks: list[list[int]]) -> torch.Tensor:
        """Logits [B, vocab] of B sequences' decode tokens in one eager step (continuous batching), each
        token's K/V written into its own blocks. Not captured: CUDA graphs replay one sequence each."""
        width = self.table_width(max(map(len, blocks)))
        table = torch.full((len(blocks), width), self.scratch_block, dtype=torch.int32)
        for row, sequence in zip(table, blocks):
            row[: len(sequence)] = torch.tensor(sequence, dtype=torch.int32)
        table = table.to(self.device, non_blocking=True)
        token = torch.tensor(tokens, dtype=torch.long, device=self.device)
        position = torch.tensor(positions, dtype=torch.long, device=self.device)
        return self.model.decode_step(token, position, PagedDecodeKV(self.pool, table, position))

    def _bucket(self, width: int) -> _Bucket:
        bucket = self._buckets.get(width)
        if bucket is None:
            table = torch.full((1, width), self.scratch_block, dtype=torch.int32, device=self.device)
            bucket = self._buckets[width] = _Bucket(table)
            if self.cuda_graphs:
                self._capture(bucket)
        return bucket

    def _capture(self, bucket: _Bucket) -> None:
        """Record the step for this table width; it writes only the scratch block while recording."""
        self.position.zero_()
        self.token.zero_()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step(bucket.table)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            bucket.logits = self._step(bucket.table)
        bucket.graph = graph
