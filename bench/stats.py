"""Statistics the benchmarks share (standard library only, so a bench can run where the server's
dependencies are not installed, e.g. on a lent GPU machine)."""

from __future__ import annotations

import random
import statistics


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """95% bootstrap interval of the median."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]
