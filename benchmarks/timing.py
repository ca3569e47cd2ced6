"""Timing shared by the benchmarks: the median of repeated runs after a warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved_times(fns: dict[str, Callable[[], object]], rounds: int, calls: int = 3) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternation (``calls`` calls
    per function per round) so that drifts of the machine's speed hit all alike."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}
