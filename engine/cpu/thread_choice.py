"""DecodeThreads: how many threads the next decode step uses, chosen from how fast the last steps ran.

A decode step's threads meet at a barrier between phases (~180 times a token in the fused step). On a
quiet machine every core helps. When another process keeps a core busy, the thread that lands on it is
descheduled for whole time slices while the others wait at the barrier: measured on 2 cores, 50 tok/s
quiet fell to 4.5 with one busy core, where one thread alone kept 30. No wait policy fixes that
without costing the quiet case (OMP_WAIT_POLICY=PASSIVE: 50 -> 34 tok/s), so the count adapts instead:
the engine decodes with the count that is measured faster, and now and then tries the others, less
often each time a try loses, so a quiet machine pays almost nothing for the checks.

A try of MORE threads must also find its cores free: if a thread of the try spent much of its steps off
its core (the step's time minus the CPU time the thread ran, which the C step clocks for each thread of a
try), the kernel gave that core to another process, and the try loses however fast it was. Without that,
two kvchat processes on 2 cores (an AMD EPYC, where decode is bound by memory) settled on one thread each
(~0.46x of alone each), then one's try of two threads won (its threads pulled more of the memory's
bandwidth), the other slowed, tried two as well and won against its slowed baseline: both on two threads
at 0.18x. Measured on 2 cores, the largest share of a two-thread step any thread was off its core: quiet,
under 0.01 in 90% of steps; beside a busy loop, 0.32 in half of them; beside a one-thread kvchat, 0.50; in
`kvchat serve` with 4 streaming clients in the same process, 0.03-0.05 at the 90th percentile (its own event
loop runs briefly between a step's barriers). An earlier rule counted the whole process's involuntary
context switches instead: the server's own event loop preempted a compute thread in most
steps, so every try of two threads lost and the server decoded, batched and prefilled on one thread.
"""

from __future__ import annotations

import statistics
from collections import deque

FIRST_PROBE_AFTER = 32  # steps on one count before trying another (the very first try: once BASELINE steps ran,
                        # so an engine that starts next to a busy core does not crawl for 32 steps)
LONGEST_PROBE_GAP = 256  # steps between tries once they keep losing (a losing try costs ~1 step)
PROBE_STEPS = 2  # a try runs this many steps; the first may pay for cold caches, the last is compared
WIN = 0.85  # a try must be at least this much faster (time ratio) to switch
RECENT = 8  # steps of the current count kept
BASELINE = 3  # the median of this many latest steps is what a try is compared with
SLOWDOWN = 2.0  # two steps this much slower than the ones before: something took a core, try now
CROWDED = 0.15  # a try of more threads whose steps' threads were off their cores this share of the time
                # (the mean over its steps of each step's worst thread) shared a core with another process


def off_core_share(clock) -> float:
    """The largest share of a step's time one of its threads spent off its core, from the fused step's
    per-thread [seconds in the step, CPU seconds run] (rows of threads that did not run are zeros)."""
    return max(((wall - ran) / wall for wall, ran in clock if wall > 0), default=0.0)


class DecodeThreads:
    def __init__(self, most: int):
        """`most`: the thread budget (torch's); candidates are most, half of it, and one."""
        self.candidates = sorted({most, max(1, most // 2), 1}, reverse=True)
        self.current = self.candidates[0]
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._gap = BASELINE
        self._since_probe = 0
        self._trying: int | None = None
        self._tried: list[tuple[float, float | None]] = []  # (seconds, off-core share) of the try's steps
        self._next_candidate = 0

    def pick(self) -> int:
        """The thread count for the next step."""
        if (self._trying is None and len(self.candidates) > 1 and len(self._recent) >= BASELINE
                and self._since_probe >= self._gap):
            others = [c for c in self.candidates if c != self.current]
            self._trying = others[self._next_candidate % len(others)]
            self._next_candidate += 1
            self._tried = []
        return self._trying if self._trying is not None else self.current

    @property
    def trying(self) -> bool:
        """Whether the step `pick` chose is a try of another count (only a try's steps are clocked per thread)."""
        return self._trying is not None

    def record(self, threads: int, seconds: float, off_core: float | None = None) -> None:
        """The wall time of a step that ran on `threads` threads (as `pick` said), and the largest share of it
        one of its threads spent off its core (off_core_share), where that was clocked."""
        if self._trying is not None and threads == self._trying:
            self._tried.append((seconds, off_core))
            if len(self._tried) < PROBE_STEPS and seconds < 2 * self._baseline():
                return  # a try that is already twice as slow ends at once
            self._finish_try(self._tried[-1][0], self._off_core())
        elif threads == self.current:
            self._recent.append(seconds)
            self._since_probe += 1
            steps = list(self._recent)
            if len(steps) == RECENT and min(steps[-2:]) > SLOWDOWN * statistics.median(steps[:-2]):
                self._since_probe = self._gap

    def _baseline(self) -> float:
        return statistics.median(list(self._recent)[-BASELINE:])

    def _off_core(self) -> float | None:
        """The mean off-core share of the try's steps (None: not clocked)."""
        shares = [share for _, share in self._tried]
        return None if None in shares else statistics.fmean(shares)

    def _finish_try(self, seconds: float, off_core: float | None) -> None:
        tried, self._trying, self._since_probe = self._trying, None, 0
        crowded = tried > self.current and off_core is not None and off_core >= CROWDED
        if seconds < WIN * self._baseline() and not crowded:
            self.current = tried
            self._recent.clear()
            self._gap = FIRST_PROBE_AFTER
        else:
            self._gap = min(max(2 * self._gap, FIRST_PROBE_AFTER), LONGEST_PROBE_GAP)
