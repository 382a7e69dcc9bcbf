"""Decode speed of several replies written at once: each one's tokens/s, and all of theirs together.

Together is the decode tokens of all of them over the time at least one was decoding (the union of
their first-to-last-token spans): side by side that is the wall time, one after another the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.reply.timeline import ReplyTimeline


@dataclass(frozen=True)
class StreamRates:
    total: float  # decode tokens/s of all together (0.0 before any has decoded)
    each: tuple[float | None, ...]  # of each, in order; None: it has not decoded yet

    def forms(self) -> list[str]:
        """"41.3 tok/s total (13.9, 13.7, 13.7 per reply)", then "41.3 tok/s total"."""
        each = ", ".join("…" if rate is None else f"{rate:.1f}" for rate in self.each)
        total = f"{self.total:.1f} tok/s total"
        return [f"{total} ({each} per reply)", total]


def _span(timeline: ReplyTimeline) -> tuple[float, float] | None:
    times = timeline.times
    return (times[0], times[-1]) if len(times) >= 2 and times[-1] > times[0] else None


def stream_rates(timelines: list[ReplyTimeline]) -> StreamRates:
    """The rates of replies whose token arrivals are `timelines` (one clock). The first token of each
    is prefill's, so a rate counts the tokens after it."""
    spans = [_span(timeline) for timeline in timelines]
    each = tuple(None if span is None else round((len(timeline) - 1) / (span[1] - span[0]), 1)
                 for timeline, span in zip(timelines, spans))
    decoding, tokens = 0.0, sum(len(t) - 1 for t, span in zip(timelines, spans) if span is not None)
    end = float("-inf")
    for start, stop in sorted(span for span in spans if span is not None):
        decoding += max(stop - max(start, end), 0.0)  # the part not covered by the spans before it
        end = max(end, stop)
    return StreamRates(round(tokens / decoding, 1) if decoding > 0 else 0.0, each)
