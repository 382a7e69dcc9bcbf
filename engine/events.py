"""The typed events a generation streams to its consumer.

A generation yields TokenDelta for each token (text may be empty while a
multi-byte character is incomplete), Stats when the numbers change (after each
prefill chunk but the last, after the first token, then a few times a second),
and exactly one Done at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATS_INTERVAL_S = 0.2  # live Stats events during decode: 5 per second (a remote stream sends them as often)


@dataclass
class RequestStats:
    """What one request cost. Times in ms; throughputs in tokens/s."""

    # None: not known (a remote server that streams no usage); the engine always knows.
    prompt_tokens: int | None = 0
    # None: not known (a remote server that does not report its cache hits); the engine always knows.
    cached_tokens: int | None = 0  # prompt tokens whose K/V were reused
    prefilled_tokens: int | None = 0  # prompt tokens computed by prefill
    # Of those, how many had their K/V cached but were computed again: a hybrid model's state had no
    # checkpoint closer to the end of the reused prefix (engine/kv/checkpoints.py).
    recomputed_tokens: int = 0
    # Of prefilled_tokens, how many are computed so far: the engine's progress while the phase is "prefill".
    prefill_done_tokens: int = 0
    generated_tokens: int = 0
    cache_source: str = "none"  # device | host | disk | none (| server, for a remote server's hits)
    ttft_ms: float = 0.0  # submit -> first token sampled
    prefill_ms: float = 0.0  # submit -> first token; while the phase is "prefill": submit -> now
    decode_ms: float = 0.0  # first token -> last token
    phase: str = "prefill"  # prefill | decode | done
    # Speculative decoding (request/speculation.py): draft tokens proposed and how many the model agreed with,
    # and the forward passes decode made (each yields 1 token + its accepted drafts).
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int = 0
    drafting_paused: bool = False  # drafts stopped paying, so steps go plain (probing now and then) as of now

    @property
    def prefill_tokens_per_s(self) -> float:
        # While the prompt is prefilled: the rate so far, of the tokens done so far.
        tokens = self.prefill_done_tokens if self.phase == "prefill" else self.prefilled_tokens
        known = tokens is not None and self.prefill_ms > 0
        return tokens / (self.prefill_ms / 1e3) if known else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # The first token comes from prefill; decode made the rest.
        steps = self.generated_tokens - 1
        return steps / (self.decode_ms / 1e3) if steps > 0 and self.decode_ms > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Decode tokens per forward pass: 1.0 without speculation, more when drafts are accepted."""
        return (self.generated_tokens - 1) / self.decode_steps if self.decode_steps > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "generated_tokens": self.generated_tokens,
            "cache_source": self.cache_source,
            "ttft_ms": round(self.ttft_ms, 2),
            "prefill_ms": round(self.prefill_ms, 2),
            "decode_ms": round(self.decode_ms, 2),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 1),
            "decode_steps": self.decode_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
        }


@dataclass(frozen=True)
class TokenDelta:
    token_id: int | None  # None for text flushed at the end (a held-back partial character)
    text: str
    # The decode step (forward pass) that made the token: 0 for the first token (prefill's), then 1, 2, ...;
    # with speculative decoding several tokens share a step. None: not known (a remote server's tokens).
    step: int | None = None


@dataclass(frozen=True)
class Stats:
    stats: RequestStats


@dataclass(frozen=True)
class Done:
    finish_reason: str  # stop | length | stopped
    stats: RequestStats
    token_ids: tuple[int, ...] = field(default=())  # every generated id, the stop token included
    text: str = ""  # the whole reply, == tokenizer.decode(token_ids)


Event = TokenDelta | Stats | Done
