"""DecodeThreads: how many threads the next decode step uses, chosen from how fast the last steps ran.

A decode step's threads meet at a barrier between phases (~180 times a token in the fused step). On a
quiet machine every core helps. When another process keeps a core busy, the thread that lands on it is
descheduled for whole time slices while the others wait at the barrier: measured on 2 cores, 50 tok/s
quiet fell to 4.5 with one busy core, where one thread alone kept 30. No wait policy fixes that
without costing the quiet case (OMP_WAIT_POLICY=PASSIVE: 50 -> 34 tok/s), so the count adapts instead:
the engine decodes with the count that is measured faster, and now and then tries the others, less
often each time a try loses, so a quiet machine pays almost nothing for the checks.

A try of MORE threads must also find its cores free: if the kernel took the CPU from the process's threads
during it (involuntary context switches over its steps), it took a core another process wanted, and it
loses however fast it was. Measured on 2 cores, two-thread steps: quiet, 8% saw such a switch (17 in 200
steps); next to a one-thread kvchat, 57% saw one or more; next to a busy loop, 3.9 a step. So a quiet try
loses ~16% of the time (and is tried again later), a crowded one ~80%. Without that, two kvchat processes
on 2 cores (an AMD EPYC, where decode is bound by memory) settled on one thread each (~0.46x of alone
each), then one's try of two threads won (its threads pulled more of the memory's bandwidth), the other
slowed, tried two as well and won against its slowed baseline: both on two threads at 0.18x.
"""

from __future__ import annotations

import statistics
from collections import deque

try:
    import resource
except ImportError:  # Windows: no preemption counts, so a try of more threads is judged by its speed alone
    resource = None

FIRST_PROBE_AFTER = 32  # steps on one count before trying another (the very first try: once BASELINE steps ran,
                        # so an engine that starts next to a busy core does not crawl for 32 steps)
LONGEST_PROBE_GAP = 256  # steps between tries once they keep losing (a losing try costs ~1 step)
PROBE_STEPS = 2  # a try runs this many steps; the first may pay for cold caches, the last is compared
WIN = 0.85  # a try must be at least this much faster (time ratio) to switch
RECENT = 8  # steps of the current count kept
BASELINE = 3  # the median of this many latest steps is what a try is compared with
SLOWDOWN = 2.0  # two steps this much slower than the ones before: something took a core, try now
CROWDED = 1  # a try of more threads preempted this often over its steps took another process's core: it loses


def involuntary_switches() -> int:
    """How often the kernel has taken the CPU from this process's threads so far (0 where it does not say)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw if resource is not None else 0


class DecodeThreads:
    def __init__(self, most: int):
        """`most`: the thread budget (torch's); candidates are most, half of it, and one."""
        self.candidates = sorted({most, max(1, most // 2), 1}, reverse=True)
        self.current = self.candidates[0]
        self._recent: deque[float] = deque(maxlen=RECENT)
        self._gap = BASELINE
        self._since_probe = 0
        self._trying: int | None = None
        self._tried: list[tuple[float, int | None]] = []  # (seconds, preemptions) of the try's steps
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
        """Whether the step `pick` chose is a try of another count (only a try's preemptions are asked for)."""
        return self._trying is not None

    def record(self, threads: int, seconds: float, preempted: int | None = None) -> None:
        """The wall time of a step that ran on `threads` threads (as `pick` said), and how often the kernel
        preempted the process's threads meanwhile, where that was counted."""
        if self._trying is not None and threads == self._trying:
            self._tried.append((seconds, preempted))
            if len(self._tried) < PROBE_STEPS and seconds < 2 * self._baseline():
                return  # a try that is already twice as slow ends at once
            self._finish_try(self._tried[-1][0], self._preemptions())
        elif threads == self.current:
            self._recent.append(seconds)
            self._since_probe += 1
            steps = list(self._recent)
            if len(steps) == RECENT and min(steps[-2:]) > SLOWDOWN * statistics.median(steps[:-2]):
                self._since_probe = self._gap

    def _baseline(self) -> float:
        return statistics.median(list(self._recent)[-BASELINE:])

    def _preemptions(self) -> int | None:
        """How often the try's threads were preempted in all its steps (None: not counted)."""
        counts = [preempted for _, preempted in self._tried]
        return None if None in counts else sum(counts)

    def _finish_try(self, seconds: float, preempted: int | None) -> None:
        tried, self._trying, self._since_probe = self._trying, None, 0
        crowded = tried > self.current and preempted is not None and preempted >= CROWDED
        if seconds < WIN * self._baseline() and not crowded:
            self.current = tried
            self._recent.clear()
            self._gap = FIRST_PROBE_AFTER
        else:
            self._gap = min(max(2 * self._gap, FIRST_PROBE_AFTER), LONGEST_PROBE_GAP)
