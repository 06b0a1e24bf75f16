"""95% ranges from a sample's own spread: of one value around the median, and of the median itself.

Sigma is 1.4826 x the median absolute deviation (MAD), which one slow sample does not inflate; a value's range
is 1.96 sigma (``range95``). That is the band for comparing two runs (a step's wall time here against a re-run's):
medians move from run to run by more than their standard error says, because two runs on one machine differ by
their load, placement and clocks, which one run's repeats share. Two figures priced from the same run's medians
(a stage's cost at two layer splits) share those, and differ by the medians' own error: sqrt(pi/2) sigma / sqrt(n)
for a median of n values (``median_range95``, at 1.96 of it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Final

Z95: Final = 1.96
MAD_TO_SIGMA: Final = 1.4826


def range95(values: Sequence[float]) -> float:
    """One value's 95% range around the median of ``values``; 0 with fewer than two."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return Z95 * MAD_TO_SIGMA * statistics.median(abs(v - middle) for v in values)


def median_range95(values: Sequence[float]) -> float:
    """The 95% range of the median of ``values``: ``range95`` x sqrt(pi/2) / sqrt(n); 0 with fewer than two."""
    return range95(values) * math.sqrt(math.pi / 2 / len(values)) if len(values) >= 2 else 0.0
