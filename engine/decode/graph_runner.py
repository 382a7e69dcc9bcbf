"""DecodeRunner: the decode step of a paged sequence as a static function, replayed per token.

At batch 1 a decode step is a few hundred small kernels; launched one by one
from Python, the GPU waits on the launches (launch-bound). The step here takes
only device tensors (token, position, block table), whose shapes never change
for a given table width, so it can be captured once in a CUDA graph (one
launch per token) or compiled by torch.compile, and replayed at every
position of every sequence.

Block tables come in power-of-two widths (at least MIN_TABLE_BLOCKS), and a batch
of several sequences' tokens (continuous batching) in power-of-two row counts; each
(rows, width) bucket has its own static inputs and, with CUDA graphs, its own graph,
captured the first time a step needs that shape. Padding rows write and read the
scratch block. Paged decode attention reads only the blocks below each sequence's
length, so a wide table costs little.
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
                  mask: torch.Tensor | None, scale: float, window: int | None = None,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        return attend_in_place(self.pool, layer, q, k, v, self.blocks, self.offsets, self.table, self.seq_len, scale,
                               window, sinks)


@dataclass
class _Bucket:
    """The static inputs (and, with CUDA graphs, the graph) of one (rows, table width) shape."""

    token: torch.Tensor  # [rows] long
    position: torch.Tensor  # [rows] long
    table: torch.Tensor  # [rows, width] int32
    blocks: list[list[int]] = field(default_factory=list)  # what each table row holds now
    graph: "torch.cuda.CUDAGraph | None" = None
    logits: torch.Tensor | None = None  # the graph's output buffer


class DecodeRunner:
    def __init__(self, model: CausalLM, cache: PrefixCache, cuda_graphs: bool, compile: bool):
        device = model.device
        if cuda_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model, self.pool, self.cuda_graphs = model, cache.pool, cuda_graphs
        self.device = device
        # Warm-up and capture write K/V somewhere: a block of its own, never handed to a sequence. Padding
        # rows of a batch write there too.
        self.scratch_block = cache.reserve_block()
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        # dynamic=False: one specialised graph per shape, like the CUDA graphs; fullgraph: a step that
        # falls back to Python midway would bring the launch overhead back, so it is an error.
        self._step = (torch.compile(self._eager_step, dynamic=False, fullgraph=True)
                      if compile else self._eager_step)
        self._static = cuda_graphs or compile  # shapes must repeat: batches are padded to bucket sizes

    def _eager_step(self, token: torch.Tensor, position: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return self.model.decode_step(token, position, PagedDecodeKV(self.pool, table, position))

    @staticmethod
    def table_width(num_blocks: int) -> int:
        return max(MIN_TABLE_BLOCKS, 1 << (num_blocks - 1).bit_length())

    def step(self, token: int, position: int, blocks: list[int]) -> torch.Tensor:
        """Logits [1, vocab] of `token` at `position`, its K/V written into `blocks` (which must
        already cover position). The result may be a static buffer: read it before the next step."""
        return self.step_batch([token], [position], [blocks])

    def step_batch(self, tokens: list[int], positions: list[int], blocks: list[list[int]]) -> torch.Tensor:
        """Logits [B, vocab] of B sequences' decode tokens in one step (continuous batching), each token's
        K/V written into its own blocks (which must already cover its position). With CUDA graphs (or
        compile) the batch is padded to a power of two, padding rows writing and reading the scratch
        block, and each (rows, width) shape has its graph. The result may be a static buffer: read it
        before the next step."""
        count = len(tokens)
        rows = 1 << (count - 1).bit_length() if self._static else count
        bucket = self._bucket(rows, self.table_width(max(map(len, blocks))))
        for b in range(rows):
            wanted = blocks[b] if b < count else []
            if bucket.blocks[b] != wanted:  # a new block, a new sequence, or a block swapped by deduplication
                row = torch.full((bucket.table.shape[1],), self.scratch_block, dtype=torch.int32)
                row[: len(wanted)] = torch.tensor(wanted, dtype=torch.int32)
                bucket.table[b].copy_(row, non_blocking=True)
                bucket.blocks[b] = list(wanted)
        pad = rows - count
        bucket.token.copy_(torch.tensor(tokens + [0] * pad, dtype=torch.long), non_blocking=True)
        bucket.position.copy_(torch.tensor(positions + [0] * pad, dtype=torch.long), non_blocking=True)
        if bucket.graph is not None:
            bucket.graph.replay()
            return bucket.logits[:count]
        return self._step(bucket.token, bucket.position, bucket.table)[:count]

    def _bucket(self, rows: int, width: int) -> _Bucket:
        bucket = self._buckets.get((rows, width))
        if bucket is None:
            device = self.device
            bucket = self._buckets[(rows, width)] = _Bucket(
                token=torch.zeros(rows, dtype=torch.long, device=device),
                position=torch.zeros(rows, dtype=torch.long, device=device),
                table=torch.full((rows, width), self.scratch_block, dtype=torch.int32, device=device),
                blocks=[[] for _ in range(rows)])
            if self.cuda_graphs:
                self._capture(bucket)
        return bucket

    def _capture(self, bucket: _Bucket) -> None:
        """Record the step for this shape; every row writes only the scratch block while recording."""
        bucket.position.zero_()
        bucket.token.zero_()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._step(bucket.token, bucket.position, bucket.table)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            bucket.logits = self._step(bucket.token, bucket.position, bucket.table)
        bucket.graph = graph
