"""Partial rotary embeddings (Phi-4-mini) in kvchat's whole-head RoPE, by reordering each q and k head.

A partial rotary head rotates only its first r = rotary_dim dims, as pairs (i, i + r/2) for i < r/2
(rotate-half over those r), and passes its other head_dim - r dims through. kvchat's RoPE, in the eager
and paged paths and in the fused C step alike, rotates the whole head as pairs (j, j + head_dim/2) by one
cos/sin table row. Rather than teach all three a second layout, the loader reorders the rows of every
q and k projection (weights and biases) per head, so that

    dim i       -> j = i                  (i < r/2: a rotated pair's first dim)
    dim i + r/2 -> j = i + head_dim/2     (its second dim)
    the head_dim - r pass-through dims -> j in [r/2, head_dim/2) and [r/2 + head_dim/2, head_dim), in order,

and the table gives the pass-through pairs cos 1 and sin 0 (model/rope.py), which leaves them exactly as
they were. Attention reads q and k only through q . k, which is the same sum over a head's dims in any
order, so reordering both alike changes nothing but the order of that sum; v and the output projection
are not touched. The KV cache holds k in this order, which is the model's own from load to load.

PartialRotaryRows is the loader's view (weights/checkpoint.py) of a checkpoint with those rows reordered.
"""

from __future__ import annotations

import torch

from engine.config.model import ModelConfig


def head_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """kvchat's dim j of a head is Hugging Face's dim head_order(...)[j] (int64 [head_dim])."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    rotated = torch.arange(rot_half)
    passing = torch.arange(rotary_dim, head_dim)  # split evenly between the two halves, in order
    first, second = passing[: half - rot_half], passing[half - rot_half :]
    return torch.cat((rotated, first, rotated + rot_half, second))


def projection_rows(heads: int, head_dim: int, rotary_dim: int, rows: int) -> torch.Tensor:
    """The order of a projection's `rows` whose first `heads` heads are q or k heads (the rest, v's rows in a
    fused q/k/v, stay where they are)."""
    order = head_order(head_dim, rotary_dim)
    heads_rows = (torch.arange(heads)[:, None] * head_dim + order).flatten()
    return torch.cat((heads_rows, torch.arange(heads * head_dim, rows)))


class PartialRotaryRows:
    """A WeightSource (weights/checkpoint.py) whose q and k rows come in the order above: those of q_proj and
    k_proj, or of a fused qkv_proj (Phi-3's: its q and k heads first, v's rows left in place), weights and
    biases (and a q/k norm's weight), dense or as a matrix's blocks ("<name>.<format>.qs": each row a row of
    the matrix, so whole rows move and the blocks are untouched). A reordered tensor is a copy; any other comes
    from the source as it is."""

    def __init__(self, source, cfg: ModelConfig):
        self._source = source
        # A source whose block tensors view a file (GGUF) says so; the loader reads it from here.
        self.IN_PLACE = getattr(source, "IN_PLACE", False)
        self._head_dim, self._rotary_dim = cfg.head_dim, cfg.rope.rotary_dim(cfg.head_dim)
        # Tensor -> how many q/k heads lead its rows. A per-head q/k norm's weight is one head's worth: its
        # mean of squares does not depend on the order, so reordered alike it stays exact.
        self._heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads,
                       "qkv_proj": cfg.num_heads + cfg.num_kv_heads, "q_norm": 1, "k_norm": 1}

    def __contains__(self, name: str) -> bool:
        return name in self._source

    def get(self, name: str) -> torch.Tensor:
        tensor = self._source.get(name)
        heads = self._q_k_heads(name)
        if heads is None:
            return tensor
        return tensor[projection_rows(heads, self._head_dim, self._rotary_dim, tensor.shape[0])]

    def block_format(self, name: str) -> str | None:
        return self._source.block_format(name)

    def release(self, blocks: torch.Tensor) -> None:
        release = getattr(self._source, "release", None)
        if release is not None:  # a reordered copy is not the file's: the source leaves it alone
            release(blocks)

    def _q_k_heads(self, name: str) -> int | None:
        """How many q/k heads lead the rows of tensor `name` ("...self_attn.<projection>.weight", ".bias", or
        a weight's blocks "...weight.<format>.qs"), or None: it holds no q or k rows."""
        parts = name.split(".")
        if "self_attn" not in parts:
            return None
        at = parts.index("self_attn") + 1
        return self._heads.get(parts[at]) if at < len(parts) else None
