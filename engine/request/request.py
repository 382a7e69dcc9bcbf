"""Request: one generation's plain state, from the prompt to Done.

The step loop (request/loop.py) changes it; the scheduler reads it to plan a step; the consumer's
Generation (request/generation.py) takes its events from `outbox`. Nothing here computes.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from engine.events import Event, RequestStats
from engine.kv.sequence import SequenceKV
from engine.request.constraint import GrammarConstraint
from engine.request.detokenizer import IncrementalDetokenizer
from engine.request.sampling import Sampler
from engine.request.speculation import Speculator
from engine.sampling_params import SamplingParams


class Status(Enum):
    WAITING = "waiting"  # submitted, or preempted (its KV given back; it resumes from its tokens); no KV
    PREFILL = "prefill"  # computing the uncached rest of the prompt, a chunk per step
    DECODE = "decode"  # one token per step, plus the draft tokens it verifies (speculation.py)
    FINISHED = "finished"  # Done is in the outbox, or `error` is set; its KV is closed


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    use_prefix_cache: bool = True
    generated: list[int] = field(default_factory=list)  # sampled ids, the stop token included
    status: Status = Status.WAITING
    cancelled: threading.Event = field(default_factory=threading.Event)
    constraint: GrammarConstraint | None = None  # params.grammar, compiled by Engine.generate; the Sampler uses it
    # Set when the request starts running:
    kv: SequenceKV | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    sampler: Sampler | None = None
    detokenizer: IncrementalDetokenizer | None = None
    speculator: Speculator | None = None  # None: speculative decoding is off
    pieces: list[str] = field(default_factory=list)  # the reply's text so far, piece by piece
    submitted_at: float = 0.0  # perf_counter seconds; TTFT counts from here
    first_token_at: float = 0.0
    last_stats_at: float = 0.0
    outbox: deque[Event] = field(default_factory=deque)  # made, not yet taken by the consumer
    error: BaseException | None = None  # the request failed: its consumer raises this after the outbox
    preemptions: int = 0  # times its KV was given back for others' (the pool was full); it recomputes them

    @property
    def context_ids(self) -> list[int]:
        """The tokens whose K/V the request needs before its next step: the prompt, and after a preemption
        the reply but its last token (which the next decode step computes)."""
        return self.prompt_ids + self.generated[:-1] if self.generated else self.prompt_ids

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def next_tokens(self, prefill_chunk: int, context_window: int, max_drafts: int, others: int = 0) -> list[int]:
        """The ids the next step computes: the next prompt chunk, or the last sampled token and at most
        `max_drafts` draft tokens to verify after it (no more than the reply has room for: a step yields
        up to 1 + drafts); `others`: the other requests decoding in the same step."""
        if self.status is Status.PREFILL:
            begin = self.kv.num_tokens
            return self.context_ids[begin : begin + prefill_chunk]
        if self.speculator is None:
            return [self.generated[-1]]
        room = context_window - len(self.prompt_ids) - len(self.generated)
        if self.params.max_tokens is not None:
            room = min(room, self.params.max_tokens - len(self.generated))
        return [self.generated[-1], *self.speculator.draft(min(room - 1, max_drafts), others)]
