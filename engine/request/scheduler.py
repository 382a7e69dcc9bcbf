"""Scheduler: owns the waiting and running requests and plans each step's work.

A step is a list of Work: which tokens of which requests go into the next forward. Today one request
runs at a time (MAX_RUNNING), the oldest first, and a step holds its next prompt chunk or decode token;
batching raises MAX_RUNNING and puts several requests' tokens into one step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.request.request import Request, Status

MAX_RUNNING = 1


@dataclass(frozen=True)
class Work:
    request: Request
    token_ids: list[int]
    prefill: bool  # a prompt chunk (False: a decode token, then the draft tokens to verify after it)


class Scheduler:
    def __init__(self, prefill_chunk: int, context_window: int):
        self.prefill_chunk = prefill_chunk
        self.context_window = context_window
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests to running while there is room; the caller opens their KV."""
        admitted = []
        while self.waiting and len(self.running) < MAX_RUNNING:
            request = self.waiting.popleft()
            self.running.append(request)
            admitted.append(request)
        return admitted

    def plan(self) -> list[Work]:
        """The next step: each running request's next tokens."""
        return [Work(r, r.next_tokens(self.prefill_chunk, self.context_window), r.status is Status.PREFILL)
                for r in self.running if not r.finished]

    def remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
