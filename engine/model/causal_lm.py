"""CausalLM: the Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2, Qwen3)."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.attention import prefix_causal_mask
from engine.model.config import ModelConfig
from engine.kv.cache import KVAttention, KVCache
from engine.model.layers import DecoderLayer, RMSNorm
from engine.model.rope import RotaryEmbedding


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary: RotaryEmbedding | None = None

    def prepare(self) -> None:
        """Build the RoPE tables on the weights' device and dtype; call after loading weights."""
        weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(self.cfg.rope, self.cfg.head_dim, self.cfg.context_window,
                                      weight.device, weight.dtype)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """Run T new tokens [T] after the cache's tokens; store their K/V in `cache`.

        Returns logits [T, vocab] if `all_logits`, else [1, vocab] for the last token,
        in the model's dtype.
        """
        num_new = token_ids.shape[0]
        start = cache.num_tokens
        cache.reserve(num_new)
        cos = self.rotary.cos[start : start + num_new].unsqueeze(1)
        sin = self.rotary.sin_signed[start : start + num_new].unsqueeze(1)
        mask = prefix_causal_mask(num_new, start + num_new, token_ids.device)
        x = self.embed_tokens(token_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, cache, mask)
        cache.commit(num_new)
        if not all_logits:
            x = x[-1:]
        return self.lm_head(self.norm(x))

    def decode_step(self, token: torch.Tensor, position: torch.Tensor, kv: KVAttention) -> torch.Tensor:
        """One decode token per sequence, `token` [B] at `position` [B], both device tensors: logits [B, vocab]
        (B = 1 for a single sequence; several for a batch, each row attending over its own blocks).

        The same layers as `forward`, with no Python number derived from the sequence,
        so the step can be captured in a CUDA graph or compiled once and replayed at
        every position. `kv` stores the token's K/V and attends (see decode/graph_runner.py)."""
        cos = self.rotary.cos[position].unsqueeze(1)
        sin = self.rotary.sin_signed[position].unsqueeze(1)
        x = self.embed_tokens(token)
        for layer in self.layers:
            x = layer(x, cos, sin, kv, None)
        return self.lm_head(self.norm(x))
