"""Scheduler: owns the waiting and running requests and plans each step's work (continuous batching).

A step is a list of Work: which tokens of which requests go into the next forward pass. Up to
`max_batch` requests run at once, admitted oldest first as others finish. Each step takes the decode
token (and the drafts to verify) of every decoding request, and a prompt chunk of the oldest request
still prefilling: the whole chunk when nobody decodes, at most MIXED_PREFILL_CHUNK tokens while others
do, so a long new prompt slows the streams already running instead of freezing them. Newer prompts
share what is left of that chunk while the step's rows fit in one fused pass (`joined_rows`, the
runner's): requests arriving together are prefilled in one pass over the weights, not one each. A
prompt that would need a pass of its own waits: it would only delay the tokens of the ones before it.

Decode tokens of one step share `decode_rows` (the most tokens one batched decode forward takes): each
decoding request has one, and drafts share what is left.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.request.request import Request, Status

# Prompt tokens a step prefills while other requests decode. Prefill runs ~700 tokens/s on this 2-core
# CPU: 128 tokens hold the decode streams up ~0.2 s per step, instead of ~3 s for a 2,048-token chunk.
MIXED_PREFILL_CHUNK = 128


@dataclass(frozen=True)
class Work:
    request: Request
    token_ids: list[int]
    prefill: bool  # a prompt chunk (False: a decode token, then the draft tokens to verify after it)


class Scheduler:
    def __init__(self, prefill_chunk: int, context_window: int, max_batch: int = 1, decode_rows: int = 48):
        self.prefill_chunk = prefill_chunk
        self.context_window = context_window
        self.max_batch = max_batch
        self.decode_rows = decode_rows
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> Request | None:
        """The next waiting request, moved to running, if there is room (the caller opens its KV)."""
        if not self.waiting or len(self.running) >= self.max_batch:
            return None
        request = self.waiting.popleft()
        self.running.append(request)
        return request

    def plan(self, joined_rows: int = 0) -> list[Work]:
        """The next step: every decoding request's next tokens, and prompt chunks (the module says which);
        `joined_rows`: the most rows one fused pass takes with prompt chunks in it (0: none joins)."""
        live = [r for r in self.running if not r.finished]
        decoding = [r for r in live if r.status is Status.DECODE]
        spare = max(0, self.decode_rows - len(decoding))
        drafts = spare // len(decoding) if decoding else 0
        step = [Work(r, r.next_tokens(self.prefill_chunk, self.context_window, drafts, len(decoding) - 1), False)
                for r in decoding]
        chunk = min(self.prefill_chunk, MIXED_PREFILL_CHUNK) if decoding else self.prefill_chunk
        rows = sum(len(work.token_ids) for work in step)
        for request in (r for r in live if r.status is Status.PREFILL):
            tokens = request.next_tokens(chunk, self.context_window, 0)
            if len(step) > len(decoding) and rows + len(tokens) > joined_rows:  # a prompt is in: this one must join
                break
            step.append(Work(request, tokens, True))
            rows, chunk = rows + len(tokens), chunk - len(tokens)
            if chunk == 0:
                break
        return step

    def preempt(self, request: Request) -> None:
        """`request` gives its place back (its KV was closed): it waits first in line to resume."""
        self.running.remove(request)
        self.waiting.appendleft(request)

    def remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
