"""ReplyTimeline: when each token of one reply arrived, for its tokens/s over time, and which decode
step made it, for how many tokens each step made (speculative decoding makes several in one).

The generating loop calls `token()` once per token, so that only appends a
float and counts the step; the rates are worked out when someone asks for them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable


class ReplyTimeline:
    """The arrival times of one reply's tokens (the clock's seconds, never decreasing), and the number
    of tokens each decode step made."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.times: list[float] = []
        self._step_tokens: Counter[int] = Counter()  # decode step (1, 2, ...) -> tokens it made
        self._steps_known = True  # False once a token came without its step (a remote server's)

    def __len__(self) -> int:
        return len(self.times)

    def token(self, at: float | None = None, step: int | None = None) -> None:
        """One token arrived now (or `at`, a time of the same clock), made by decode step `step`
        (TokenDelta.step: 0 is prefill's first token; None: not known)."""
        self.times.append(self._clock() if at is None else at)
        if step is None:
            self._steps_known = False
        elif step > 0:
            self._step_tokens[step] += 1

    def step_sizes(self) -> dict[int, int]:
        """Tokens a decode step made -> how many steps made that many, smallest first: {1: 40, 2: 10}
        (without speculation every step makes 1). {} when a token's step was not known, or none decoded."""
        if not self._steps_known:
            return {}
        return dict(sorted(Counter(self._step_tokens.values()).items()))

    def rates(self, points: int = 48) -> list[float]:
        """Tokens/s from the first token to the last, in at most `points` equal time buckets.

        Each token after the first (which prefill made) was made over the time since the
        one before it, so it is shared among the buckets that time overlaps: a steady
        reply comes out flat wherever the bucket edges fall, and a stall lowers every
        bucket it spans instead of leaving an empty one before a spike. The mean is the
        reply's decode tokens/s. No more buckets than decode tokens; [] with fewer than
        two tokens, or when they all arrived at once (no time to divide by).
        """
        if points < 1:
            raise ValueError("points must be at least 1")
        times = self.times
        if len(times) < 2 or times[-1] <= times[0]:
            return []
        start = times[0]
        buckets = min(points, len(times) - 1)
        width = (times[-1] - start) / buckets

        def bucket_of(t: float) -> int:  # the end time belongs to the last bucket
            return min(int((t - start) / width), buckets - 1)

        tokens = [0.0] * buckets
        for before, at in zip(times, times[1:]):
            first, last = bucket_of(before), bucket_of(at)
            if first == last:  # also tokens that arrived together
                tokens[first] += 1
                continue
            per_s = 1 / (at - before)
            for k in range(first, last + 1):
                overlap = min(at, start + (k + 1) * width) - max(before, start + k * width)
                tokens[k] += max(overlap, 0.0) * per_s
        return [round(count / width, 1) for count in tokens]
