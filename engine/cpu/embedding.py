"""QuantEmbedding: a token embedding that stays in its stored format (GGUF blocks, bf16, f16).

Only the looked-up rows are dequantized, each by the kernels' own decoder (kc_dequantize on one row),
so a row is the dense fp32 embedding's bit for bit. Qwen2.5-1.5B's table is 151936 x 1536: 933 MB as
fp32, 128 MB as Q4_K. A tied lm_head is the same QuantLinear (the same stored blocks), not a copy.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.cpu.linear import QuantLinear


class QuantEmbedding(nn.Module):
    def __init__(self, table: QuantLinear):
        """`table`: the embedding matrix [vocab, hidden] as a QuantLinear (a tied model's lm_head itself)."""
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.table.fmt} blocks"

    def row_into(self, token: int, out: torch.Tensor) -> int:
        """Write row `token` into `out` (fp32, contiguous, embedding_dim values); its address."""
        self.table._dequantize(out.data_ptr(), token, 1, 1)
        return out.data_ptr()

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        flat = token_ids.reshape(-1).tolist()
        if flat and not 0 <= min(flat) <= max(flat) < self.num_embeddings:
            raise IndexError("a token id is outside the embedding table")
        out = torch.empty(len(flat), self.embedding_dim, dtype=torch.float32)
        for row, token in zip(out, flat):
            self.row_into(token, row)
        return out.view(*token_ids.shape, self.embedding_dim)
