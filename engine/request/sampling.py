"""The per-request Sampler (greedy, temperature, top-k/p, min-p, repetition penalty, a grammar); its settings
are SamplingParams (sampling_params.py).

Filters are applied in the order transformers' `generate` applies them: repetition penalty, temperature,
top-k, top-p, min-p; a grammar's mask (constraint.py) comes after the penalty, before the rest, as
transformers' logits processors run before its warpers.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from engine.request.constraint import GrammarConstraint
from engine.sampling_params import SamplingParams  # noqa: F401  (engine.request.sampling's public name too)


class Sampler:
    """Picks each next token of one request; holds its RNG, the tokens seen so far and its grammar's state."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids: list[int], device: torch.device,
                 constraint: GrammarConstraint | None = None):
        """`constraint`: the request's compiled grammar (None: none); every token picked goes through it."""
        self.params = params
        self.constraint = constraint
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seen = None
        if params.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[torch.tensor(prompt_ids, dtype=torch.long, device=device)] = True

    def __call__(self, logits: torch.Tensor) -> int:
        """Next token id from logits [vocab] of the last position."""
        token = self.sample(logits.float())
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.seen is not None:
            self.seen[token] = True
        return token

    def sample(self, logits: torch.Tensor) -> int:
        p = self.params
        if self.seen is not None:
            penalised = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
            logits = torch.where(self.seen, penalised, logits)
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        if p.greedy:
            if logits.device.type == "cpu":  # numpy's argmax: 4 µs on 49,152 logits, torch's 63 (its thread team);
                return int(np.argmax(logits.numpy()))  # both take the first of equal maxima, and a NaN first
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
