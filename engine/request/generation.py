"""Generation: a consumer's handle on one request: iterate it for the events, cancel it from anywhere."""

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

    def __iter__(self) -> Iterator[Event]:
        request = self.request
        self._loop.submit(request)
        try:
            while True:
                while request.outbox:
                    event = request.outbox.popleft()
                    yield event
                    if isinstance(event, Done):
                        return
                if request.error is not None:
                    raise request.error
                self._loop.step()
        finally:
            self._loop.abandon(request)  # nothing if it finished; else its KV is freed now
