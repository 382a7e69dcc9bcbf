"""SamplingParams and the per-request Sampler (greedy, temperature, top-k/p, min-p, repetition penalty).

Filters are applied in the order transformers' `generate` applies them:
repetition penalty, temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy (argmax), deterministic
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    max_tokens: int | None = None  # None = until a stop token or the context window
    seed: int | None = None  # same seed, same prompt -> same tokens
    ignore_eos: bool = False  # benchmarks: always generate max_tokens

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, "temperature must be 0 (greedy) or positive"),
            (0 < self.top_p <= 1, "top-p must be in (0, 1]"),
            (self.top_k >= 0, "top-k must be 0 (off) or positive"),
            (0 <= self.min_p <= 1, "min-p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition penalty must be positive"),
            (self.max_tokens is None or self.max_tokens >= 1, "max tokens must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Picks each next token of one request; holds its RNG and the tokens seen so far."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: list[int], device: torch.device):
        self.params = params
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seen = None
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[torch.tensor(prompt_ids, dtype=torch.long, device=device)] = True

    def __call__(self, logits: torch.Tensor) -> int:
        """Next token id from logits [vocab] of the last position."""
        token = self.sample(logits.float())
        if self.seen is not None:
            self.seen[token] = True
        return token

    def sample(self, logits: torch.Tensor) -> int:
        p = self.params
        if self.seen is not None:
            penalised = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
            logits = torch.where(self.seen, penalised, logits)
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k and p.top_k < logits.shape[-1]:
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            logits = _top_p(logits, p.top_p)
        if p.min_p > 0.0:
            probs = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # A token is dropped if the tokens before it already reach top_p; the first always stays.
    drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))
