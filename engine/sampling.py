"""SamplingParams and the per-request Sampler (greedy, temperature, top-k/p, min-p, repetition penalty).

Filters are applied in the order transformers' `generate` applies them:
repetition penalty, temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Documented bounds. Above a temperature of a few, sampling is close to uniform over the vocabulary
# (token soup); OpenAI's API stops at 2. A top-k at or above the vocabulary size is the same as off.
MAX_TEMPERATURE = 5.0
MAX_REPETITION_PENALTY = 10.0
MAX_SEED = 2**64 - 1  # what torch.Generator.manual_seed takes
MAX_INT64 = 2**63 - 1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        """ValueError (one phrase, for "kvchat: ..." or an HTTP 400) for a value outside its documented range.
        NaN fails every comparison below, so it is refused too."""
        checks = [
            (_is_number(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE,
             f"temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g}"),
            (_is_number(self.top_p) and 0 < self.top_p <= 1, "top-p must be in (0, 1]"),
            (_is_int(self.top_k) and 0 <= self.top_k <= MAX_INT64, "top-k must be 0 (off) or positive"),
            (_is_number(self.min_p) and 0 <= self.min_p <= 1, "min-p must be in [0, 1]"),
            (_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
             f"repetition penalty must be above 0 and at most {MAX_REPETITION_PENALTY:g}"),
            (self.max_tokens is None or (_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_INT64),
             "max tokens must be at least 1"),
            (self.seed is None or (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED),
             f"seed must be a whole number from 0 to {MAX_SEED}"),
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
