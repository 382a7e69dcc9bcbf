"""Timing for the bench: interleaved medians (the contenders share a noisy machine alike) and a timer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(runs: int, measures: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Median of each measure over `runs` rounds; a round runs every measure once, in turn.

    Interleaving spreads the noise of a shared machine over all contenders alike.
    """
    for measure in measures.values():
        measure()  # warm-up: first-touch allocations and kernel selection
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(runs):
        for name, measure in measures.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def seconds() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return seconds
