"""Generation: a consumer's handle on one request: iterate it for the events, cancel it from anywhere.

One consumer, one request: iterate the Generation (each pull runs a step when its events are used up;
other requests in the step get their events too, in their own outboxes). Several requests on one
thread (a server's clients, N candidate replies): `interleave` hands out everyone's events as the
steps make them, so the requests decode together (continuous batching), or drive it yourself with
`submit`, `take` and `Engine.step`.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.events import Done, Event
from engine.request.loop import StepLoop
from engine.request.request import Request
from engine.sampling_params import SamplingParams


class Generation:
    """One request's event stream. Iterate once; the request is submitted when iteration starts."""

    def __init__(self, loop: StepLoop, request: Request):
        self._loop = loop
        self.request = request
        self._submitted = False
        self.done = False  # Done was taken, or the request's error raised

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def use_prefix_cache(self) -> bool:
        return self.request.use_prefix_cache

    def cancel(self) -> None:
        """Stop before the next step; the stream ends with Done('stopped')."""
        self.request.cancelled.set()

    def submit(self) -> None:
        """Queue the request (once): the next step may start it."""
        if not self._submitted:
            self._submitted = True
            self._loop.submit(self.request)

    def take(self) -> list[Event]:
        """The events made so far and not yet taken (Done last); the request's error, raised, once its
        events are taken. Runs nothing."""
        events = []
        outbox = self.request.outbox
        while outbox and not self.done:
            events.append(outbox.popleft())
            self.done = isinstance(events[-1], Done)
        if not events and not self.done and self.request.error is not None:
            self.done = True
            raise self.request.error
        return events

    def close(self) -> None:
        """The consumer is gone: end the request now if it has not ended, and free its KV."""
        self._loop.abandon(self.request)

    def __iter__(self) -> Iterator[Event]:
        self.submit()
        try:
            while not self.done:
                events = self.take()
                yield from events
                if not events and not self.done:
                    self._loop.step()
        finally:
            self.close()  # nothing if it finished; else its KV is freed now


def interleave(generations: list[Generation]) -> Iterator[tuple[int, Event | BaseException]]:
    """(index, event) of several generations as the steps make them, on the calling thread; a request
    that fails yields its error instead of Done. Every request is submitted first, so they decode
    together; leaving early ends the unfinished ones."""
    for generation in generations:
        generation.submit()
    try:
        while not all(g.done for g in generations):
            progressed = False
            for i, generation in enumerate(generations):
                try:
                    events = generation.take()
                except Exception as exc:  # this request failed; the others go on
                    events = [exc]
                for event in events:
                    progressed = True
                    yield i, event
            if not progressed:
                generations[0]._loop.step()
    finally:
        for generation in generations:
            generation.close()
